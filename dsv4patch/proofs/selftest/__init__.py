"""``dsv4patch selftest``: prove the installed vLLM on the node it runs on (issue 30).

Why a package of its own: the check has four separable parts, each testable
without a GPU except the engine itself: :mod:`.model` (the tiny DeepSeek-V4
and the weights that make greedy decoding exact), :mod:`.oracle` (what the
tokens and the drafts must be), :mod:`.cases` (which engines and prompt sets
run), :mod:`.runner` (child processes with deadlines, the status and
regression-test checks, the report).  :mod:`.child` is the engine side: it
runs in the interpreter of the environment under test, imports only the
standard library, torch and vLLM, and loads :mod:`.model` by file path, so
that environment needs no dsv4patch.
"""
