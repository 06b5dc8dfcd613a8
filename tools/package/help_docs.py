#!/usr/bin/env python3
"""Writes the man page and the bash completion of `allocshim` from its own --help (CLI11's format),
so that neither can disagree with the tool.

usage: help_docs.py ALLOCSHIM MAN_OUT COMPLETION_OUT
"""
import re
import subprocess
import sys


def help_of(tool, words):
    out = subprocess.run([tool, *words, "--help"], check=True, capture_output=True, text=True).stdout
    return out.splitlines()


def parse(lines, words):
    """CLI11 help: a description, 'Usage: PATH WORDS... ARGS', then sections ('Positionals:',
    'Options:', 'Subcommands:') of two-column indented entries, then an unindented footer."""
    doc = {"description": [], "usage": "", "sections": {}, "footer": []}
    section = None
    for line in lines:
        text = line.strip()
        if line.startswith("Usage: "):
            doc["usage"] = " ".join(line.split()[2 + len(words):])
            section = "body"
        elif section is None:
            if text:
                doc["description"].append(text)
        elif re.fullmatch(r"[A-Z][a-z]+:", line):
            section = line[:-1]
            doc["sections"][section] = []
        elif not text:
            continue
        elif not line.startswith(" "):
            doc["footer"].append(text)
        elif section in doc["sections"]:
            entries = doc["sections"][section]
            if len(line) - len(line.lstrip()) > 4 and entries:  # the description of a long name
                name, what = entries[-1]
                entries[-1] = (name, (what + " " + text).strip())
            else:
                parts = re.split(r"\s{2,}", text, maxsplit=1)
                entries.append((parts[0], parts[1] if len(parts) > 1 else ""))
    return doc


def subcommands(doc):
    return [name for name, _ in doc["sections"].get("Subcommands", [])]


def option_names(doc):
    names = []
    for spec, _ in doc["sections"].get("Options", []):
        names += [n for n in spec.split(" ", 1)[0].split(",") if n.startswith("-")]
    return names


def takes_value(spec):
    return " " in spec  # CLI11 writes the value's type after the names: "-p,--policy TEXT"


def roff(text):
    text = text.replace("\\", "\\\\").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def man_page(top, commands, version):
    what = top["description"][0].partition(": ")[2]
    out = [f'.TH ALLOCSHIM 1 "" "{roff(version)}" "User Commands"', ".SH NAME",
           f"allocshim \\- {roff(what)}", ".SH SYNOPSIS"]
    for cmd, doc in commands:
        out += [f".B allocshim {cmd}", roff(doc["usage"]), ".br"]
    out += [".B allocshim", "\\-\\-help | \\-\\-version", ".SH DESCRIPTION", roff(what) + "."]
    out += [".SH COMMANDS"]
    for cmd, doc in commands:
        out += [f".SS allocshim {cmd}", roff(" ".join(doc["description"])) + "."]
        for section in ("Positionals", "Options"):
            for spec, text in doc["sections"].get(section, []):
                out += [".TP", f".B {roff(spec)}", roff(text)]
        for line in doc["footer"]:
            out += [".PP", roff(line)]
    out += [".SH FILES",
            ".TP", ".I PREFIX/lib/liballocshim.so",
            "The preloaded library that `allocshim run` puts into LD_PRELOAD.",
            ".TP", ".I PREFIX/lib/allocshim/",
            "Private copies of the libraries the shim and the tool need (libzstd, libunwind, libdw and theirs).",
            ".TP", ".I PREFIX/share/allocshim/policies/",
            "Example policies.",
            ".SH SEE ALSO",
            "The README and docs/ (installed in PREFIX/share/doc/allocshim/): policy reference, tracing, "
            "deployment (containers, Kubernetes, Slurm, torchrun and mpirun)."]
    return "\n".join(out) + "\n"


def completion(top, commands):
    cases = []
    for cmd, doc in commands:
        valued = [n for spec, _ in doc["sections"].get("Options", []) if takes_value(spec)
                  for n in spec.split(" ", 1)[0].split(",")]
        cases.append(f"    {cmd}) opts='{' '.join(option_names(doc))}'; valued='{' '.join(valued)}' ;;")
    return f"""# bash completion for allocshim, generated from its --help by tools/package/help_docs.py
_allocshim() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} cmd= i opts valued
  for ((i = 1; i < COMP_CWORD; i++)); do
    if [[ ${{COMP_WORDS[i]}} == -- && -n $cmd ]]; then
      # After `allocshim run --`: complete the program and its arguments.
      if declare -F _command_offset >/dev/null; then _command_offset $((i + 1)); return; fi
      COMPREPLY=($(compgen -c -- "$cur")); return
    fi
    [[ -z $cmd && ${{COMP_WORDS[i]}} != -* ]] && cmd=${{COMP_WORDS[i]}}
  done
  if [[ -z $cmd ]]; then
    COMPREPLY=($(compgen -W '{' '.join(subcommands(top))} {' '.join(option_names(top))}' -- "$cur"))
    return
  fi
  case $cmd in
{chr(10).join(cases)}
    *) return ;;
  esac
  if [[ " $valued " == *" $prev "* ]]; then COMPREPLY=($(compgen -f -- "$cur")); return; fi
  if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W "$opts" -- "$cur")); return; fi
  COMPREPLY=($(compgen -f -- "$cur"))
}}
complete -o filenames -F _allocshim allocshim
"""


def main():
    tool, man_out, completion_out = sys.argv[1:4]
    top = parse(help_of(tool, []), [])
    commands = [(cmd, parse(help_of(tool, [cmd]), [cmd])) for cmd in subcommands(top)]
    version = subprocess.run([tool, "--version"], check=True, capture_output=True, text=True).stdout.strip()
    with open(man_out, "w") as f:
        f.write(man_page(top, commands, version))
    with open(completion_out, "w") as f:
        f.write(completion(top, commands))


if __name__ == "__main__":
    main()
