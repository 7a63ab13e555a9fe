"""``sakura bench e2e --json FILE.jsonl``: the run written as it goes (JSON lines), so memory does not grow with runs.

One JSON object per line, in this order::

    {"record": "header", "format": "sakura-e2e-runs", "version": 1, "command": ..., "argv": ..., ...}
    {"record": "run", "result": i, "trace": ..., "policy": ..., "latency_s": ..., ...}   # each run once simulated
    {"record": "result", "result": i, "kv_mode": ..., "summary": ..., "by_class": ...}  # after its runs
    ...                                                                                   # the next combination
    {"record": "end", "results": n, "runs": m, "seconds": ...}

A run's line holds its figures (and its ``events`` / ``decisions`` only for the policies ``--events`` names); a
result's line is what the whole JSON's ``results[i]`` holds, less ``runs``. :func:`load_e2e` rebuilds that whole JSON
(``sakura bench results`` renders its tables from it) and refuses a file that is cut off (no ``end`` record: the run
did not finish) or has a line that is not JSON, naming the line and the fix. :class:`JsonSink` is the same interface
writing one ordinary JSON at the end (runs held in memory: for small runs and the committed ``.json`` files).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sakura_core.files import atomic_write_json

__all__ = ["FORMAT", "E2eStreamError", "JsonSink", "JsonlSink", "load_e2e", "open_sink"]

FORMAT = "sakura-e2e-runs"
_VERSION = 1


class E2eStreamError(ValueError):
    """A streamed e2e file that cannot be read back whole (cut off, corrupt, another format or version)."""


def _line(obj: dict) -> str:
    return json.dumps(obj, default=float, allow_nan=True, separators=(",", ":")) + "\n"


class JsonlSink:
    """Writes the JSON-lines file above as the run goes: each line flushed when written, nothing kept but counts.
    ``close`` writes the ``end`` record; a run that stops before it leaves a file :func:`load_e2e` refuses."""

    def __init__(self, path: str | Path, header: dict) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("w", encoding="utf-8")
        self.results = 0
        self.runs = 0
        self._write({"record": "header", "format": FORMAT, "version": _VERSION, **header})

    def _write(self, obj: dict) -> None:
        self._fh.write(_line(obj))
        self._fh.flush()

    def run(self, row: dict) -> None:
        """One simulated run (its figures; ``events`` / ``decisions`` when kept), written now, not held."""
        self._write({"record": "run", "result": self.results, **row})
        self.runs += 1

    def result(self, result: dict) -> None:
        """The summaries of the combination whose runs came before (no ``runs`` key)."""
        self._write({"record": "result", "result": self.results, **{k: v for k, v in result.items() if k != "runs"}})
        self.results += 1

    def close(self, seconds: float) -> None:
        self._write({"record": "end", "results": self.results, "runs": self.runs, "seconds": seconds})
        self._fh.close()
        os.chmod(self.path, 0o644)

    def abort(self) -> None:
        """Stop without the ``end`` record (the file stays, refused by :func:`load_e2e` as cut off)."""
        self._fh.close()


class JsonSink:
    """The same interface, one JSON written at ``close`` (``{**header, **results[0]}`` for one combination, else
    ``{**header, "results": [...]}``); runs are kept in memory unless ``keep_runs`` is False."""

    def __init__(self, path: str | Path, header: dict, keep_runs: bool = True) -> None:
        self.path, self.header, self.keep_runs = Path(path), header, keep_runs
        self._runs: list[dict] = []
        self._results: list[dict] = []

    def run(self, row: dict) -> None:
        if self.keep_runs:
            self._runs.append(row)

    def result(self, result: dict) -> None:
        self._results.append({**result, **({"runs": self._runs} if self.keep_runs else {})})
        self._runs = []

    def close(self, seconds: float) -> None:
        common = {**self.header, "seconds": seconds}
        res = self._results
        out = {**common, **res[0]} if len(res) == 1 else {**common, "results": res}
        atomic_write_json(self.path, json.loads(json.dumps(out, default=float)))

    def abort(self) -> None:
        self._runs, self._results = [], []


def open_sink(path: str | Path, header: dict, keep_runs: bool = True) -> JsonlSink | JsonSink:
    """A :class:`JsonlSink` for a ``.jsonl`` path (runs streamed; ``keep_runs`` False writes none), else a
    :class:`JsonSink`."""
    if str(path).endswith(".jsonl"):
        sink = JsonlSink(path, header)
        if not keep_runs:
            sink.run = lambda row: None  # type: ignore[method-assign]  # --no-runs: summaries only
        return sink
    return JsonSink(path, header, keep_runs)


def _records(path: Path):
    with path.open(encoding="utf-8") as fh:
        for n, text in enumerate(fh, 1):
            if not text.endswith("\n"):
                raise E2eStreamError(
                    f"{path}: line {n} is cut off (no newline): the run stopped while writing it; "
                    "rerun the command in its first line"
                )
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise E2eStreamError(
                    f"{path}: line {n} is not JSON ({e.msg} at column {e.colno}): the file is "
                    "corrupt; rerun the command in its first line"
                ) from e
            if not isinstance(obj, dict) or "record" not in obj:
                raise E2eStreamError(f"{path}: line {n} is not a record of a {FORMAT} file (no 'record' key)")
            yield n, obj


def load_e2e(path: str | Path, with_runs: bool = True) -> dict:
    """The whole e2e JSON of a ``.jsonl`` file (``results``: one per combination, each with its ``runs`` unless
    ``with_runs`` is False), or of an ordinary ``.json`` file as it is. Raises :class:`E2eStreamError` for a file
    cut off before its ``end`` record, a corrupt line, records out of order or another format / version."""
    path = Path(path)
    if not str(path).endswith(".jsonl"):
        return json.loads(path.read_text())
    head, end = None, None
    results: list[dict] = []
    runs: list[dict] = []
    for n, obj in _records(path):
        kind = obj.pop("record")
        if head is None:
            if kind != "header" or obj.get("format") != FORMAT:
                raise E2eStreamError(
                    f"{path}: line {n} is not a {FORMAT} header (record {kind!r}, format "
                    f"{obj.get('format')!r}); write it with sakura bench e2e --json FILE.jsonl"
                )
            if obj.get("version") != _VERSION:
                raise E2eStreamError(f"{path}: {FORMAT} version {obj.get('version')!r}; this code reads {_VERSION}")
            head = {k: v for k, v in obj.items() if k not in ("format", "version")}
        elif end is not None:
            raise E2eStreamError(f"{path}: line {n} follows the 'end' record: two runs written into one file?")
        elif kind == "run":
            if obj.pop("result") != len(results):
                raise E2eStreamError(f"{path}: line {n}: a run of result {len(results)} expected")
            if with_runs:
                runs.append(obj)
        elif kind == "result":
            if obj.pop("result") != len(results):
                raise E2eStreamError(f"{path}: line {n}: result {len(results)} expected")
            results.append({**obj, **({"runs": runs} if with_runs else {})})
            runs = []
        elif kind == "end":
            end = obj
        else:
            raise E2eStreamError(f"{path}: line {n}: unknown record {kind!r}")
    if head is None:
        raise E2eStreamError(f"{path}: empty: no {FORMAT} header; rerun sakura bench e2e --json {path}")
    if end is None:
        raise E2eStreamError(
            f"{path}: cut off after {len(results)} results: no 'end' record (the run stopped before "
            f"it finished); rerun `{head.get('command', 'sakura bench e2e')}`"
        )
    if end.get("results") != len(results):
        raise E2eStreamError(
            f"{path}: the 'end' record counts {end.get('results')} results, the file holds {len(results)}"
        )
    return {**head, "seconds": end.get("seconds"), "results": results}
