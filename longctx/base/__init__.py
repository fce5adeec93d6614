"""Foundations every package imports, with no dependencies of their own: the error a user caused
(errors.py), the label value every loss ignores (labels.py) and package namespaces that load their
names on first use (lazy_exports.py)."""
