#!/usr/bin/env python3
"""Fails when an #include crosses the layers of shim/layers.txt, or when the docs draw another graph.

usage: layers.py REPO_ROOT        every #include "..." and <cuda*.h> of the layers' directories
                                  against the table; the table in docs/architecture.md against it
       layers.py --build CXX LAYERS_DIR CUDA_INCLUDE REPO_ROOT
                                  the build's own include folders (LAYERS_DIR/<layer>, made by
                                  shim/CMakeLists.txt): a header of every layer a layer may include
                                  preprocesses there, a header of every other layer does not
       layers.py --self-test      an upward include and a stray <cuda.h> are caught

A quoted include resolves as the compiler would find it: beside the including file, then under
shim/, the repository root, tools/ and tests/fake/. Includes that resolve nowhere (generated
headers) are the compiler's to judge.
"""
import os
import re
import subprocess
import sys
import tempfile

TABLE = "shim/layers.txt"
DOC = "docs/architecture.md"
SOURCE_EXT = (".h", ".hpp", ".cpp", ".c", ".cu", ".cuh", ".S", ".def", ".in")
INCLUDE_ROOTS = ["shim", ".", "tools", "tests/fake"]
QUOTED = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
CUDA = re.compile(r"^\s*#\s*include\s*<(cuda[\w.]*\.h|cudaTypedefs\.h)>")
DOC_BEGIN, DOC_END = "<!-- layers: made from shim/layers.txt -->", "<!-- /layers -->"


def read_table(root):
    """[(layer, directory, [layers it may include])], lowest first."""
    rows = []
    with open(os.path.join(root, TABLE)) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            layer, directory, *sees = line.split()
            rows.append((layer, directory, [] if sees == ["-"] else sees))
    return rows


def layer_of(path, rows):
    """The layer whose directory holds `path` (relative to the root); the deepest wins."""
    best = None
    for layer, directory, _ in rows:
        if path == directory or path.startswith(directory.rstrip("/") + "/"):
            if best is None or len(directory) > len(best[1]):
                best = (layer, directory)
    return best[0] if best else None


def resolve(root, including, name):
    for base in [os.path.dirname(including)] + INCLUDE_ROOTS:
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def check_sources(root, rows):
    sees = {layer: set(s) | {layer} for layer, _, s in rows}
    errors = []
    for layer, directory, _ in rows:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, directory)):
            dirnames[:] = sorted(d for d in dirnames if d != "results")
            for name in sorted(filenames):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                if layer_of(path, rows) != layer:
                    continue  # a deeper layer's file
                with open(os.path.join(root, path), errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        if CUDA.match(line) and "cuda" not in sees[layer]:
                            errors.append(f"{path}:{number}: layer {layer} includes <cuda.h> or the "
                                          f"runtime's headers, which only the layers that name "
                                          f"`cuda` in {TABLE} may")
                        m = QUOTED.match(line)
                        if not m:
                            continue
                        target = resolve(root, path, m.group(1))
                        if target is None:
                            continue
                        other = layer_of(target, rows)
                        if other is None:
                            errors.append(f"{path}:{number}: layer {layer} includes {target}, "
                                          f"which is in no layer of {TABLE}")
                        elif other not in sees[layer]:
                            errors.append(f"{path}:{number}: layer {layer} includes "
                                          f'"{m.group(1)}" of layer {other}, which {TABLE} '
                                          f"does not let it include")
    return errors


def doc_table(rows):
    lines = [DOC_BEGIN, "| layer | directory | may include |", "|---|---|---|"]
    for layer, directory, s in reversed(rows):
        lines.append(f"| {layer} | `{directory}/` | {', '.join(s) if s else '-'} |")
    lines.append(DOC_END)
    return "\n".join(lines)


def check_doc(root, rows):
    path = os.path.join(root, DOC)
    if not os.path.exists(path):
        return []
    text = open(path).read()
    begin, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if begin < 0 or end < 0:
        return [f"{DOC}: no layer table between {DOC_BEGIN} and {DOC_END}"]
    if text[begin:end + len(DOC_END)] != doc_table(rows):
        return [f"{DOC}: its layer table is not {TABLE}'s; it should read:\n{doc_table(rows)}"]
    return []


def check_build(cxx, layers_dir, cuda_include, root):
    """Each compiled layer's include folder lets through exactly the layers the table names."""
    rows = read_table(root)
    compiled = [r for r in rows if os.path.isdir(os.path.join(layers_dir, r[0]))]
    errors = []
    for layer, _, sees in compiled:
        for other, directory, _ in rows:
            headers = sorted(h for h in os.listdir(os.path.join(root, directory)) if h.endswith(".h"))
            if other == layer or not headers or not directory.startswith(("shim/", "policy")):
                continue
            name = os.path.basename(directory) + "/" + headers[0]
            result = subprocess.run(
                [cxx, "-std=c++20", "-E", "-x", "c++", "-o", os.devnull,
                 "-I", os.path.join(layers_dir, layer), "-isystem", cuda_include, "-"],
                input=f'#include "{name}"\n', capture_output=True, text=True)
            allowed = other in sees
            if allowed and result.returncode != 0:
                errors.append(f"layer {layer} may include {other}, but {name} does not build "
                              f"there:\n{result.stderr.strip()}")
            if not allowed and result.returncode == 0:
                errors.append(f"layer {layer} may not include {other}, yet {name} builds there")
            if not allowed and "No such file" not in result.stderr:
                errors.append(f"layer {layer}: {name} failed for another reason than a missing "
                              f"include:\n{result.stderr.strip()}")
    if not compiled:
        errors.append(f"no layer include folders under {layers_dir}")
    return errors


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        write(TABLE, "core shim/core -\ntrace shim/trace core\nabi shim/abi trace core cuda\n")
        write("shim/core/a.h", "#pragma once\n")
        write("shim/trace/t.h", '#include "core/a.h"\n')
        write("shim/abi/x.cpp", '#include <cuda.h>\n#include "trace/t.h"\n#include "gen.h"\n')
        rows = read_table(root)
        assert check_sources(root, rows) == [], check_sources(root, rows)
        write("shim/core/b.cpp", '#include "trace/t.h"\n#include <cuda.h>\n')
        errors = check_sources(root, rows)
        assert len(errors) == 2 and errors[0].startswith("shim/core/b.cpp:1: layer core"), errors
        assert errors[1].startswith("shim/core/b.cpp:2: layer core includes <cuda.h>"), errors
        write(DOC, "x\n" + doc_table(rows) + "\n")
        assert check_doc(root, rows) == []
        write(DOC, doc_table(rows).replace("core, cuda", "cuda"))
        assert len(check_doc(root, rows)) == 1
    print("layers.py self-test: an upward include, a stray <cuda.h> and a stale doc table are caught")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) == 6 and argv[1] == "--build":
        errors = check_build(argv[2], argv[3], argv[4], argv[5])
    elif len(argv) == 2:
        rows = read_table(argv[1])
        errors = check_sources(argv[1], rows) + check_doc(argv[1], rows)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
