"""The label value every loss ignores: padding, document starts and prompt tokens.

-100 is PyTorch's `cross_entropy` default `ignore_index` and transformers' label convention, so
labels written here mean the same to their losses. Dependency-free: data (numpy) and the model
(torch) both read it.
"""
IGNORE_INDEX = -100
