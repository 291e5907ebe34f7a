"""cpu.compiled.load and loader: a module's compile_all runs once per process, from any
thread."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from mgcaffe.cpu import compiled

pytest.importorskip("numba", reason="load() compiles only where numba imports")


def test_threads_asking_together_compile_once_and_share_the_result():
    calls = []

    def compile_all(numba):
        calls.append(threading.current_thread().name)
        time.sleep(0.05)  # long enough for the other threads to ask meanwhile
        return object()

    results = []
    threads = [threading.Thread(target=lambda: results.append(compiled.load(compile_all)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert compiled.load(compile_all) is results[0]  # and later calls too


def test_without_numba_it_gives_none_and_compiles_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` raises ImportError
    assert compiled.load(lambda numba: pytest.fail("compiled without numba")) is None


def test_a_modules_loader_compiles_once_and_gives_the_same_result():
    calls = []

    def compile_all(numba):
        calls.append(numba)
        return object()

    load = compiled.loader(compile_all, "The test's loops.")
    first = load()
    assert load() is first and load() is first
    assert len(calls) == 1 and calls[0] is sys.modules["numba"]
    assert load.__doc__ == "The test's loops."


def test_a_loader_without_numba_gives_none_every_time(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)
    load = compiled.loader(lambda numba: pytest.fail("compiled without numba"), "")
    assert load() is None and load() is None
