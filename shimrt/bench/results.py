"""The overlap benchmark's results file (schema ``shimrt.bench.overlap/1``): reading it and
checking every value a plot draws or prints, so that ``bench plot`` refuses, naming the value,
what it cannot draw (a negative or infinite time, a string where a number belongs, an SM that
does not exist) instead of raising deep inside matplotlib or drawing it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ShimrtError
from ..targets import MAX_SMS
from ..validate import shown

__all__ = ["SCHEMA", "validate", "load"]

SCHEMA = "shimrt.bench.overlap/1"
METRICS = ("makespan_ms", "t_comp_ms", "t_comm_ms")
MAX_MS = 1e9         # 11 days: a longer time is no benchmark's, and near 1e308 the axes overflow
MAX_LABEL = 200      # characters of a workload, policy or device name (file names and titles hold them)


def validate(results: Any) -> None:
    """Raise ShimrtError, naming the first problem, unless ``results`` follows the schema: every
    value a plot draws or prints is checked here, so that nothing is drawn from a value that
    means nothing (a negative or infinite time, a string where a number belongs, an SM that
    does not exist)."""
    if not isinstance(results, dict):
        raise ShimrtError(f"results must be a JSON object, not {type(results).__name__}")
    if results.get("schema") != SCHEMA:
        raise ShimrtError(f"results schema is {shown(results.get('schema'))}, expected {SCHEMA!r}")
    runs = results.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ShimrtError("results have no 'runs' (a non-empty list)")
    device = results.get("device")
    if device is not None and not isinstance(device, dict):
        raise ShimrtError("results 'device' is not an object")
    device = device or {}
    sms = device.get("num_sms")
    if sms is not None and not _int(sms, 1, MAX_SMS):
        raise ShimrtError(f"results device.num_sms must be an int in 1..{MAX_SMS}, not {shown(sms)}")
    for key in ("name", "arch", "backend"):
        if device.get(key) is not None and not _label(device[key]):
            raise ShimrtError(f"results device.{key} must be a string of 1..{MAX_LABEL} characters, not "
                              f"{shown(device[key])}")
    if results.get("comm") is not None and not _label(results["comm"]):
        raise ShimrtError(f"results 'comm' must be a string of 1..{MAX_LABEL} characters, not {shown(results['comm'])}")
    seen = set()
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise ShimrtError(f"results run {i} is not an object")
        for key in ("workload", "policy"):
            if not _label(run.get(key)):
                raise ShimrtError(f"results run {i} has no {key!r} (a string of 1..{MAX_LABEL} characters): "
                                  f"{shown(run.get(key))}")
        where = f"results run {i} ({run['workload']}, {run['policy']})"
        metrics = run.get("metrics")
        if not isinstance(metrics, dict):
            raise ShimrtError(f"{where} has no 'metrics'")
        for key in METRICS:
            if not _time(metrics.get(key), positive=True):
                raise ShimrtError(f"{where} has no metrics.{key} (a positive number of ms up to {MAX_MS:g}): "
                                  f"{shown(metrics.get(key))}")
        if metrics.get("reduction") is not None and not _finite(metrics["reduction"]):
            raise ShimrtError(f"{where}: metrics.reduction must be a finite number, not {shown(metrics['reduction'])}")
        for key in ("timeline", "timeline_blocks", "choice"):
            if run.get(key) is not None and not isinstance(run[key], dict):
                raise ShimrtError(f"{where}: {key} is not an object")
        if run.get("describe") is not None and not isinstance(run["describe"], str):
            raise ShimrtError(f"{where}: describe must be a string, not {shown(run['describe'])}")
        for kind, count in (run.get("timeline_blocks") or {}).items():
            if not _int(count, 0, None):
                raise ShimrtError(f"{where}: timeline_blocks.{kind} must be an int >= 0 (a block count), not "
                                  f"{shown(count)}")
        for kind, rows in (run.get("timeline") or {}).items():
            _check_rows(rows, f"{where}: timeline.{kind}", sms)
        pair = (run["workload"], run["policy"])
        if pair in seen:
            raise ShimrtError(f"results have two runs of workload {pair[0]!r} with policy {pair[1]!r}")
        seen.add(pair)
    summary = results.get("summary")
    if summary is not None and not (isinstance(summary, list) and all(isinstance(s, dict) for s in summary)):
        raise ShimrtError("results 'summary' is not a list of objects")
    for i, entry in enumerate(summary or []):
        if entry.get("model_ms") is not None and not _time(entry["model_ms"], positive=True):
            raise ShimrtError(f"results summary {i}: model_ms must be a positive number of ms up to {MAX_MS:g}, not "
                              f"{shown(entry['model_ms'])}")


def _check_rows(rows: Any, where: str, sms: int | None) -> None:
    """A timeline's rows: [start_ms, end_ms, sm] each, 0 <= start <= end <= MAX_MS, sm an SM of
    the device (below num_sms, or MAX_SMS where it is not given) or -1 (not known: CUPTI's)."""
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) and len(r) == 3 and all(
            _number(x) for x in r) for r in rows):
        raise ShimrtError(f"{where} is not a list of [start_ms, end_ms, sm] numbers")
    if not rows:
        return
    try:
        a = np.array(rows, dtype=float)
    except OverflowError:  # an int beyond any float
        raise ShimrtError(f"{where} has a number too large for a time or an SM") from None
    start, end, sm = a.T
    bad = ~(np.isfinite(start) & np.isfinite(end) & (start >= 0) & (start <= end) & (end <= MAX_MS))
    if bad.any():
        i = int(bad.argmax())
        raise ShimrtError(f"{where} row {i} must have 0 <= start_ms <= end_ms <= {MAX_MS:g}, not {shown(rows[i])}")
    limit = sms or MAX_SMS
    bad = ~np.isfinite(sm) | (sm != np.floor(sm)) | (sm < -1) | (sm >= limit)
    if bad.any():
        i = int(bad.argmax())
        raise ShimrtError(f"{where} row {i} must have an SM index in 0..{limit - 1} (or -1: not known), not "
                          f"{shown(rows[i][2])}")


def _number(value) -> bool:
    """An int or a float, Python's or numpy's: never a bool, never a string of digits."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _finite(value) -> bool:
    return _number(value) and _float_ok(value)


def _float_ok(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _time(value, positive: bool = False) -> bool:
    """A time in ms the plots can draw: finite, at most MAX_MS, positive or at least 0."""
    return _finite(value) and (value > 0 if positive else value >= 0) and value <= MAX_MS


def _int(value, least: int, most: int | None) -> bool:
    return bool(_number(value) and isinstance(value, (int, np.integer)) and value >= least
                and (most is None or value <= most))


def _label(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_LABEL


def load(path: Any) -> dict:
    """Read and validate a results JSON file."""
    if Path(path).exists() and not Path(path).is_file():  # a folder, or a device or pipe read forever
        raise ShimrtError(f"cannot read {path}: not a regular file")
    try:
        with open(path) as f:
            results = json.load(f)
    except OSError as exc:
        raise ShimrtError(f"cannot read {path}: {exc.strerror}") from exc
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested beyond reason
        raise ShimrtError(f"{path} is not a JSON file: {exc}") from exc
    validate(results)
    return results
