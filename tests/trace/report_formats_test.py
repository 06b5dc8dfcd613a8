#!/usr/bin/env python3
"""`allocshim report` end to end on the checked-in trace, each output checked by what reads it:

- speedscope: valid against speedscope's published file format schema (the rules of
  https://www.speedscope.app/file-format-schema.json, jlfwong/speedscope, transcribed below), and
  consistent (frame indices in range, one weight per sample, endValue = the weights' sum);
- memory-snapshot: loads with pickle and has the structure PyTorch's torch/cuda/_memory_viz.py and
  memory_viz read (segments with blocks, device_traces of alloc/free_completed actions with frames of
  filename/line/name); replaying it as memory_viz does gives the report's peak;
- perfetto: every allocation slice begins and ends;
- every format also for a trace whose path is not valid UTF-8 (exit 0, valid output).

Usage: report_formats_test.py ALLOCSHIM DATA_DIR
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

ALLOCSHIM = DATA = None

# speedscope's schema (draft-06), the parts a sampled profile uses. Each rule as there: "type",
# "enum", "required", "properties", "items", "anyOf".
NUMBER = {"type": "number"}
STRING = {"type": "string"}
VALUE_UNIT = {"type": "string",
              "enum": ["bytes", "microseconds", "milliseconds", "nanoseconds", "none", "seconds"]}
FRAME = {"type": "object", "required": ["name"],
         "properties": {"name": STRING, "file": STRING, "line": NUMBER, "col": NUMBER}}
SAMPLED = {"type": "object",
           "required": ["endValue", "name", "samples", "startValue", "type", "unit", "weights"],
           "properties": {"type": {"type": "string", "enum": ["sampled"]}, "name": STRING,
                          "unit": VALUE_UNIT, "startValue": NUMBER, "endValue": NUMBER,
                          "samples": {"type": "array", "items": {"type": "array", "items": NUMBER}},
                          "weights": {"type": "array", "items": NUMBER}}}
EVENT = {"type": "object", "required": ["at", "frame", "type"],
         "properties": {"type": {"type": "string", "enum": ["O", "C"]}, "frame": NUMBER, "at": NUMBER}}
EVENTED = {"type": "object", "required": ["endValue", "events", "name", "startValue", "type", "unit"],
           "properties": {"type": {"type": "string", "enum": ["evented"]}, "name": STRING,
                          "unit": VALUE_UNIT, "startValue": NUMBER, "endValue": NUMBER,
                          "events": {"type": "array", "items": EVENT}}}
FILE = {"type": "object", "required": ["$schema", "profiles", "shared"],
        "properties": {"$schema": {"type": "string",
                                   "enum": ["https://www.speedscope.app/file-format-schema.json"]},
                       "shared": {"type": "object", "required": ["frames"],
                                  "properties": {"frames": {"type": "array", "items": FRAME}}},
                       "profiles": {"type": "array", "items": {"anyOf": [EVENTED, SAMPLED]}},
                       "name": STRING, "activeProfileIndex": NUMBER, "exporter": STRING}}

TYPES = {"object": dict, "array": list, "string": str,
         "number": (int, float)}


def schema_errors(value, schema, where="$"):
    """The ways `value` breaks `schema` (empty when it is valid)."""
    if "anyOf" in schema:
        if all(schema_errors(value, s, where) for s in schema["anyOf"]):
            return [f"{where}: matches none of anyOf"]
        return []
    errors = []
    t = schema.get("type")
    if t and (not isinstance(value, TYPES[t]) or (t == "number" and isinstance(value, bool))):
        return [f"{where}: not {t}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        errors += [f"{where}: lacks {k}" for k in schema.get("required", []) if k not in value]
        for k, s in schema.get("properties", {}).items():
            if k in value:
                errors += schema_errors(value[k], s, f"{where}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errors += schema_errors(v, schema["items"], f"{where}[{i}]")
    return errors


def report(trace, fmt, *extra):
    out = subprocess.run([ALLOCSHIM, "report", "--format", fmt, *extra, trace],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"report --format {fmt} exited {out.returncode}: {out.stderr.decode(errors='replace')}")
    return out.stdout


class ReportFormats(unittest.TestCase):
    def setUp(self):
        self.trace = os.path.join(DATA, "small.allocshim-trace")
        self.totals = json.loads(report(self.trace, "json"))["totals"]

    def test_speedscope_follows_the_schema(self):
        for metric in ("bytes", "calls", "peak", "time", "temporary"):
            doc = json.loads(report(self.trace, "speedscope", "--sort", metric))
            self.assertEqual(schema_errors(doc, FILE), [], metric)
            frames = doc["shared"]["frames"]
            for p in doc["profiles"]:
                self.assertEqual(len(p["samples"]), len(p["weights"]))
                self.assertEqual(p["endValue"] - p["startValue"], sum(p["weights"]))
                for stack in p["samples"]:
                    self.assertTrue(all(0 <= i < len(frames) for i in stack), stack)

    def test_schema_check_rejects_what_speedscope_would(self):
        doc = json.loads(report(self.trace, "speedscope"))
        broken = json.loads(json.dumps(doc))
        broken["profiles"][0]["unit"] = "kilobytes"
        self.assertNotEqual(schema_errors(broken, FILE), [])
        del doc["shared"]["frames"][0]["name"]
        self.assertNotEqual(schema_errors(doc, FILE), [])

    def test_memory_snapshot_is_what_memory_viz_reads(self):
        # Every frame: the native one below the Python code too (left out by default).
        snap = pickle.loads(report(self.trace, "memory-snapshot", "--native-frames"))
        self.assertIsInstance(snap["segments"], list)
        self.assertIsInstance(snap["device_traces"], list)
        actions = {"segment_alloc", "alloc", "free_requested", "free_completed", "segment_free", "oom"}
        live, peak, total, allocs = {}, 0, 0, 0
        for trace in snap["device_traces"]:
            last = 0
            for e in trace:
                self.assertIn(e["action"], actions)
                for key, kind in (("addr", int), ("size", int), ("stream", int), ("time_us", int),
                                  ("frames", list)):
                    self.assertIsInstance(e[key], kind, e)
                self.assertGreaterEqual(e["time_us"], last)
                last = e["time_us"]
                for f in e["frames"]:
                    self.assertIsInstance(f["filename"], str)
                    self.assertIsInstance(f["line"], int)
                    self.assertIsInstance(f["name"], str)
                # As memory_viz's process_alloc_data: an alloc is live until the free_completed of
                # its address.
                if e["action"] == "alloc":
                    self.assertNotIn(e["addr"], live)
                    live[e["addr"]] = e["size"]
                    total += e["size"]
                    allocs += 1
                    peak = max(peak, total)
                elif e["action"] == "free_completed":
                    total -= live.pop(e["addr"])
                elif e["action"] == "oom":
                    self.assertIn("device_free", e)
        self.assertEqual(allocs, self.totals["allocs"])
        self.assertEqual(peak, self.totals["peak_live"])
        # What is still allocated at the end is in the segments, block by block.
        blocks = {}
        for seg in snap["segments"]:
            self.assertEqual(sum(b["size"] for b in seg["blocks"]), seg["total_size"])
            for b in seg["blocks"]:
                self.assertIn(b["state"], ("active_allocated", "inactive"))
                self.assertLessEqual(b["requested_size"], b["size"])
                blocks[seg["address"]] = b["size"]
        self.assertEqual(blocks, live)
        # Frames innermost first; one of a library not here is named module+0xoffset.
        first = next(e for e in snap["device_traces"][0] if e["action"] == "alloc")
        self.assertEqual(first["frames"][:2], [
            {"filename": "libkernels.so", "line": 0, "name": "libkernels.so+0x1234"},
            {"filename": "model.py", "line": 25, "name": "alloc_buffers"}])

    def test_perfetto_slices_begin_and_end(self):
        doc = json.loads(report(self.trace, "perfetto"))
        begun, ended = {}, {}
        for e in doc["traceEvents"]:
            if e.get("cat") == "allocation":
                (begun if e["ph"] == "b" else ended)[e["id"]] = e
        self.assertEqual(len(begun), self.totals["allocs"])
        self.assertEqual(begun.keys(), ended.keys())
        for i, b in begun.items():
            self.assertLessEqual(b["ts"], ended[i]["ts"])
            self.assertGreater(b["args"]["size"], 0)

    def test_paths_that_are_not_utf8(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(os.fsencode(tmp), b"run-\xff\xfe.trace")
            with open(self.trace, "rb") as src, open(path, "wb") as dst:
                dst.write(src.read())
            for fmt in ("table", "collapsed", "speedscope", "perfetto", "json", "html", "memory-snapshot"):
                out = subprocess.run([os.fsencode(ALLOCSHIM), b"report", b"--format", fmt.encode(), path],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
                self.assertEqual(out.returncode, 0, (fmt, out.stderr))
                if fmt in ("speedscope", "perfetto", "json", "html"):
                    text = out.stdout.decode("utf-8")  # strict: raises on invalid UTF-8
                    if fmt == "json":
                        self.assertTrue(json.loads(text)["processes"][0]["path"].endswith("run-\ufffd\ufffd.trace"))
                    elif fmt != "html":
                        json.loads(text)
                elif fmt == "memory-snapshot":
                    pickle.loads(out.stdout)


if __name__ == "__main__":
    ALLOCSHIM, DATA = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
