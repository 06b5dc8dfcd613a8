#!/usr/bin/env python3
"""Fails when a source file under shim/ is over 400 lines or a function in one is over 80.

usage: shape_check.py REPO_ROOT   every source file under REPO_ROOT/shim; prints FILE: N lines for
                                  each long file and FILE:LINE: function 'NAME' is N lines for each
                                  long function, and exits 1 if there is any
       shape_check.py --self-test the counter on a sample full of braces that are not bodies

Small files and small functions are what keep the engine readable (issue #43): a file says one
thing, a function does one step that its name says. A long function is split into helpers named
for what each part does; a long file along a concept.

A function's length runs from the first line of its declaration (its template header and return
type included) to its closing brace, both counted. Lambdas and local classes count toward the
function they are written in; a lambda stored in a variable outside any function counts as a
function of its own.

How: a brace counter, not a compiler. The text is tokenized with comments, string and character
literals (raw strings and digit separators too) and preprocessor lines removed, and the braces
are matched. A brace at namespace or class scope opens a function body when the declaration before
it has a parameter list; a namespace, extern "C" or class body is searched further; an enum body or
a brace initializer is skipped. It runs in well under a second, where clang-tidy's
readability-function-size over the same files takes minutes (and counts from the body's opening
brace rather than the signature). Over every shim file it finds each function longer than 30
lines that clang-tidy's check finds, one line longer (or more, by the lines of the signature). It
assumes braces balance in every branch of an #if, which the shim's code keeps true.
"""
import os
import re
import sys

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".c", ".cu", ".cuh", ".S", ".def", ".inc")
# What a parenthesized group after them is: not a parameter list.
NOT_PARAMS = {"noexcept", "alignas", "__attribute__", "throw", "requires", "decltype", "__declspec",
              "static_assert", "sizeof", "alignof"}
ACCESS = {"public", "private", "protected"}
OPERATOR_CHARS = set("+-*/%^&|~!=<>,[]")

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"\.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.']|)*")
RAW_PREFIX = re.compile(r'(?:u8|u|U|L)?R"([^()\\ ]{0,16})\(')
STRING_PREFIX = re.compile(r"(?:u8|u|U|L)?[\"']")


def skip_block_comment(text, i, line):
    """The position after the /* comment at `i`, and the line there."""
    end = text.find("*/", i + 2)
    end = len(text) if end < 0 else end + 2
    return end, line + text.count("\n", i, end)


def skip_line_comment(text, i, line, continued):
    """The position of the newline ending the // comment at `i`, and the line there; with
    `continued` (outside a directive), a backslash before a newline continues the comment."""
    n = len(text)
    while i < n and text[i] != "\n":
        if continued and text[i] == "\\" and text.startswith("\n", i + 1):
            line += 1
            i += 1
        i += 1
    return i, line


def tokenize(text):
    """[(token, line)]: identifiers, numbers, "" for a string or character literal, and single
    punctuation characters. Comments and preprocessor lines are dropped."""
    tokens = []
    i, n, line = 0, len(text), 1
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            at_line_start = True
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "\\" and text.startswith("\n", i + 1):  # a continued line outside a directive
            i += 2
            line += 1
            continue
        if c == "#" and at_line_start:  # a directive, to its last continued line
            while i < n and text[i] != "\n":
                if text[i] == "\\" and text.startswith("\n", i + 1):
                    line += 1
                    i += 1
                elif text.startswith("/*", i):
                    i, line = skip_block_comment(text, i, line)
                    continue
                elif text.startswith("//", i):
                    i, line = skip_line_comment(text, i, line, continued=False)
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            i, line = skip_line_comment(text, i, line, continued=True)
            continue
        if text.startswith("/*", i):
            i, line = skip_block_comment(text, i, line)
            continue
        raw = RAW_PREFIX.match(text, i)
        if raw:
            close = ")" + raw.group(1) + '"'
            end = text.find(close, raw.end())
            end = n if end < 0 else end + len(close)
            tokens.append(('""', line))
            line += text.count("\n", i, end)
            i = end
            continue
        literal = STRING_PREFIX.match(text, i)
        if literal:
            quote = text[literal.end() - 1]
            j = literal.end()
            while j < n and text[j] != quote and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            tokens.append(('""', line))
            i = j + 1
            continue
        m = IDENT.match(text, i) or NUMBER.match(text, i)
        if m:
            tokens.append((m.group(0), line))
            i = m.end()
            continue
        tokens.append((c, line))
        i += 1
    return tokens


def match_brackets(tokens):
    """{index of an opening ( [ or {: index of its closing one}. Unbalanced text ends at the end."""
    pairs, stack = {}, []
    closing = {")": "(", "]": "[", "}": "{"}
    for k, (t, _) in enumerate(tokens):
        if t in "([{":
            stack.append(k)
        elif t in closing:
            while stack and tokens[stack[-1]][0] != closing[t]:
                stack.pop()  # a stray opener (an unbalanced #if branch): forget it
            if stack:
                pairs[stack.pop()] = k
    for k in stack:
        pairs[k] = len(tokens) - 1
    return pairs


def strip_template_header(head):
    """The head without a leading `template <...>` (nested ones too)."""
    while len(head) >= 2 and head[0] == "template" and head[1] == "<":
        depth, k = 0, 1
        while k < len(head):
            if head[k] == "<":
                depth += 1
            elif head[k] == ">":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        head = head[k + 1:]
    return head


def depth0(head):
    """The indices of `head` outside any parentheses, brackets or braces (openers included)."""
    out, depth = [], 0
    for k, t in enumerate(head):
        if t in "([{":
            if depth == 0:
                out.append(k)
            depth += 1
        elif t in ")]}":
            depth -= 1
        elif depth == 0:
            out.append(k)
    return out


def assignment_at(head):
    """The index of a top-level `=` that is an assignment (not ==, <=, operator=...), or -1."""
    top = set(depth0(head))
    for k in sorted(top):
        if head[k] != "=":
            continue
        before = head[k - 1] if k > 0 else ""
        after = head[k + 1] if k + 1 < len(head) else ""
        if before in OPERATOR_CHARS or after == "=" or before == "operator":
            continue
        if any(head[j] == "operator" for j in range(max(0, k - 3), k)):
            continue
        return k
    return -1


def classify(head):
    """What a brace after the declaration `head` (tokens) opens: 'scope' (namespace, extern "C",
    class), 'function', or 'skip' (enum, initializer)."""
    head = strip_template_header(head)
    while head and head[0] in ("[", "inline", "export"):
        if head[0] == "[":  # an attribute [[...]]
            depth, k = 0, 0
            while k < len(head):
                depth += {"[": 1, "]": -1}.get(head[k], 0)
                k += 1
                if depth == 0:
                    break
            head = head[k:]
        else:
            head = head[1:]
    if not head:
        return "skip"
    if head[0] == "namespace" or (head[0] == "extern" and head[1:] == ['""']):
        return "scope"
    if head[0] in ("class", "struct", "union"):
        return "scope"
    if head[0] == "enum" or head[0] == "typedef":
        return "skip"
    eq = assignment_at(head)
    if eq >= 0:
        return "function" if "[" in head[eq + 1:] and "(" in head[eq + 1:] else "skip"
    top = depth0(head)
    params = [k for k in top if head[k] == "(" and (k == 0 or head[k - 1] not in NOT_PARAMS)]
    return "function" if params else "skip"


def function_name(head):
    """The (qualified) name a function head declares, or the variable a lambda is stored in."""
    head = strip_template_header(head)
    eq = assignment_at(head)
    if eq > 0:
        return head[eq - 1]
    colon = initializer_colon(head)
    if colon >= 0:  # a constructor's initializer list
        head = head[:colon]
    for k in depth0(head):  # a trailing return type
        if head[k] == "-" and k + 1 < len(head) and head[k + 1] == ">":
            head = head[:k]
            break
    top = set(depth0(head))
    groups = [k for k in range(len(head)) if head[k] == "(" and k in top]
    for k in reversed(groups):
        before = head[k - 1] if k > 0 else ""
        if before in NOT_PARAMS or before == "(":
            continue
        return qualified(head, k)
    return "?"


def qualified(head, k):
    """The name ending just before the parameter list opening at head[k]."""
    j = k - 1
    if j >= 1 and head[j] == ")" and head[j - 1] == "(" and j >= 2 and head[j - 2] == "operator":
        name, j = "operator()", j - 3
    elif j >= 1 and head[j] == "]" and head[j - 1] == "[" and j >= 2 and head[j - 2] == "operator":
        name, j = "operator[]", j - 3
    else:
        symbols = ""
        while j >= 0 and head[j] in OPERATOR_CHARS:
            symbols = head[j] + symbols
            j -= 1
        if symbols and j >= 0 and head[j] == "operator":
            name, j = "operator" + symbols, j - 1
        elif j >= 0 and IDENT.fullmatch(head[j]):
            name, j = head[j], j - 1
            if j >= 0 and head[j] == "~":
                name, j = "~" + name, j - 1
            if j >= 0 and head[j] == "operator":  # a conversion: operator bool()
                name, j = "operator " + name, j - 1
        else:
            return "?"
    while j >= 2 and head[j] == ":" and head[j - 1] == ":" and IDENT.fullmatch(head[j - 2]):
        name, j = head[j - 2] + "::" + name, j - 3
    return name


def initializer_colon(head):
    """The index of the `:` that opens a constructor's initializer list in a function head (a
    top-level single colon after the parameter list), or -1."""
    seen_params = False
    for k in depth0(head):
        if head[k] == "(":
            seen_params = True
        elif head[k] == ":" and seen_params:
            if (k + 1 < len(head) and head[k + 1] == ":") or (k > 0 and head[k - 1] == ":"):
                continue  # a scope operator ::
            return k
    return -1


def in_initializer_list(head):
    """Whether a brace after `head` initializes a member in a constructor's initializer list (the
    head ends with the member's name after the list's colon), not the body."""
    if not head or not (IDENT.fullmatch(head[-1]) or head[-1] == ">"):
        return False
    return initializer_colon(head) >= 0


def functions(text):
    """[(name, first line, last line)] of every function defined at namespace or class scope."""
    tokens = tokenize(text)
    pairs = match_brackets(tokens)
    found = []

    def scan(begin, end):
        head_start = begin
        k = begin
        while k < end:
            t = tokens[k][0]
            if t == ";":
                head_start = k + 1
            elif t == ":" and k == head_start + 1 and tokens[head_start][0] in ACCESS:
                head_start = k + 1
            elif t in "([" and k in pairs:
                k = pairs[k]
            elif t == "{":
                close = pairs.get(k, len(tokens) - 1)
                head = [tok for tok, _ in tokens[head_start:k]]
                kind = classify(head)
                if kind == "function" and in_initializer_list(head):
                    k = close + 1  # a member's brace initializer, a(x), b{y}: the head goes on
                    continue
                if kind == "scope":
                    scan(k + 1, close)
                elif kind == "function" and head_start < k:
                    found.append((function_name(head), tokens[head_start][1], tokens[close][1]))
                k = close
                head_start = close + 1
            k += 1

    scan(0, len(tokens))
    return found


def check_file(path, shown):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    errors = []
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if lines > MAX_FILE_LINES:
        errors.append(f"{shown}: {lines} lines (at most {MAX_FILE_LINES}): split it along a concept")
    if not path.endswith((".S", ".def")):
        for name, first, last in functions(text):
            length = last - first + 1
            if length > MAX_FUNCTION_LINES:
                errors.append(f"{shown}:{first}: function '{name}' is {length} lines "
                              f"(at most {MAX_FUNCTION_LINES}): split it into named helpers")
    return errors


def check_tree(root):
    errors = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "shim")):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(SOURCE_EXT):
                path = os.path.join(dirpath, name)
                errors += check_file(path, os.path.relpath(path, root))
    return errors


SAMPLE = r'''// braces in comments { { {
#include <x.h>
#define OPEN {
namespace a {
namespace {
const char* s = "}}}";  const char c = '{';  const char* r = R"x(}")x";
int big = 1'000'000;
struct Table { int v[2] = {1, 2}; } table{{1, 2}};
enum class E : int { one, two };
}  // namespace
extern "C" {
int c_function(int x) {
  return x;
}
}
auto lambda = [](int x) {
  return x;
};
template <class T>
class Box : public Base<T> {
 public:
  Box(int x) : a_{x}, b_(x) {
    if (x) { a_ = 1; }
  }
  Box() noexcept : Box(std::vector<int>{1, 2}.size()) {}
  bool operator()(int) const { return true; }
  bool operator==(const Box&) const noexcept { return true; }
  explicit operator bool() const { return a_; }
  std::atomic<int> a_{0};
};
struct alignas(64) Aligned : Box<int> {
  void f() {}
};
int Box::Method::run(int x) noexcept(true) -> int
{
  LONG
}
void short_one() {
  SHORT
}
}  // namespace a
'''


def self_test():
    sample = SAMPLE.replace("LONG", "x;\n" * 77).replace("SHORT", "x;\n" * 76)
    found = functions(sample)
    names = [name for name, _, _ in found]
    assert names == ["c_function", "lambda", "Box", "Box", "operator()", "operator==", "operator bool", "f",
                     "Box::Method::run", "short_one"], names
    lengths = [last - first + 1 for _, first, last in found]
    assert lengths == [3, 3, 3, 1, 1, 1, 1, 1, 81, 79], lengths
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "shim", "core"))
        with open(os.path.join(root, "shim", "core", "a.cpp"), "w") as f:
            f.write(sample)
        with open(os.path.join(root, "shim", "core", "long.h"), "w") as f:
            f.write("int x;\n" * 401)
        errors = check_tree(root)
    assert len(errors) == 2, errors
    assert errors[0].startswith("shim/core/a.cpp:34: function 'Box::Method::run' is 81 lines"), errors
    assert errors[1].startswith("shim/core/long.h: 401 lines"), errors
    print("shape_check.py self-test: a long file and a long function are caught; braces in "
          "literals, comments, directives and initializers are not bodies")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    errors = check_tree(argv[1])
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
