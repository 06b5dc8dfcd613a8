"""What the model zoo's runner (zoo_run.py) and its report (zoo_report.py) both go by: the loops and
modes in the tables' order, the step the settled medians start at, the goals' thresholds, the
records' time stamps and the repository the results folder is in. Standard library only.
"""
import datetime
import os

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
MIB, GIB = 1 << 20, 1 << 30
SETTLE = 20  # steps before this are "first 20", the rest "settled" (the issue: settled by step 20)
LOOPS = ("gpt", "llama_generate", "resnet", "bert", "gpt2", "jax_mlp", "unet")
HELD_OUT = ("unet", "jax_mlp")  # the shim must not be tuned on these
MODES = ("off", "auto", "managed")
GOAL_BOUND, GOAL_NATIVE_90 = 1.3, 1.1


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
