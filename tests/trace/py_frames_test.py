"""Python frames in traces, without changing the traced program: a C call (ctypes) records an
allocation with stacks = python and both, once holding the GIL (PyDLL) and once with the GIL released
(CDLL, the helper-thread path), and `allocshim report --format json` must name these functions and
lines. Usage: py_frames_test.py LIBPYCAP ALLOCSHIM_TOOL"""
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading

lib_path, tool = sys.argv[1:3]
tmp_dir = tempfile.TemporaryDirectory(prefix="allocshim_pyframes_")
tmp = tmp_dir.name


def lineno():
    return sys._getframe(1).f_lineno


def inner_allocating_function(lib, addr):
    line = lineno() + 1
    lib.pycap_alloc(ctypes.c_ulonglong(addr), ctypes.c_ulonglong(4096))
    return line


def outer_function(lib, addr):
    line = lineno() + 1
    inner_line = inner_allocating_function(lib, addr)
    return line, inner_line


def check_helper_blocks_signals():
    """The helper thread takes none of the program's signals (Python's handlers run on its own)."""
    masks = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/comm" % task) as f:
                if f.read().strip() != "allocshim-py":
                    continue
            with open("/proc/self/task/%s/status" % task) as f:
                masks += [int(l.split()[1], 16) for l in f if l.startswith("SigBlk:")]
        except FileNotFoundError:
            continue  # a thread that exited after the listing (an earlier check's helper going away)
    assert masks, "no thread named allocshim-py"
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD):
        assert all(m & (1 << (sig - 1)) for m in masks), (sig, [hex(m) for m in masks])


def check(mode_name, mode, loader):
    lib = loader(lib_path)
    lib.pycap_start.argtypes = [ctypes.c_char_p, ctypes.c_int]
    path = os.path.join(tmp, "pyframes_%s_%s_%d.trace" % (mode_name, loader.__name__, os.getpid()))
    assert lib.pycap_start(path.encode(), mode) == 0
    outer_line, inner_line = outer_function(lib, 0x100000)
    # Another Python thread running (and wanting the GIL) while the allocation happens.
    done = []
    t = threading.Thread(target=lambda: done.append(outer_function(lib, 0x200000)))
    t.start()
    t.join()
    if loader is ctypes.CDLL:
        check_helper_blocks_signals()
    lib.pycap_stop()
    def site_frames(*extra):
        out = subprocess.run([tool, "report", "--format", "json", "--top", "0", *extra, path],
                             check=True, capture_output=True, text=True).stdout
        sites = json.loads(out)["hot_spots"]["calls"]
        assert sites, out
        return sites[0]["frames"]
    # By default the allocating Python line leads the site; --native-frames keeps every frame.
    first = site_frames()[0]
    assert first.get("python") and first["function"] == "inner_allocating_function", first
    frames = site_frames("--native-frames")
    py = [f for f in frames if f.get("python")]
    names = [(f["function"], f.get("line")) for f in py]
    assert ("inner_allocating_function", inner_line) in names, (mode_name, loader.__name__, names, frames[:5])
    assert ("outer_function", outer_line) in names, (mode_name, names)
    # Innermost first: the allocating function comes before its caller.
    assert names.index(("inner_allocating_function", inner_line)) < names.index(("outer_function", outer_line))
    if mode_name == "python":
        assert len(py) == len(frames), frames[:5]  # Python frames only
    else:
        assert len(py) < len(frames), "both: native frames too"
    print("ok: %s stacks, %s: %s" % (mode_name, loader.__name__, names[:3]))


for name, mode in (("python", 2), ("both", 3)):
    check(name, mode, ctypes.PyDLL)   # GIL held during the call
    check(name, mode, ctypes.CDLL)    # GIL released: the helper thread reads the frames
