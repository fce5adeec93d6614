"""An in-memory stand-in for the job's c10d store (the calls the stall watch's courier makes),
counting each call; `hang` makes every call block, as a store on a node cut off does."""
import threading
from collections import Counter


class MemoryStore:
    def __init__(self, data=None, hang: bool = False):
        self.data = {k: v.encode() if isinstance(v, str) else v for k, v in (data or {}).items()}
        self.calls = Counter()
        self.hang = hang
        self._lock = threading.Lock()

    def _call(self, name: str) -> None:
        if self.hang:
            threading.Event().wait()  # for ever: the watch must not wait with it
        with self._lock:
            self.calls[name] += 1

    def set(self, key, value):
        self._call("set")
        self.data[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys):
        self._call("check")
        return all(k in self.data for k in keys)

    def multi_get(self, keys):
        self._call("multi_get")
        return [self.data[k] for k in keys]

    def add(self, key, amount):
        self._call("add")
        self.data[key] = str(int(self.data.get(key, b"0")) + amount).encode()
        return int(self.data[key])
