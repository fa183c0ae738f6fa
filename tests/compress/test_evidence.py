"""Evidence protection: block features (edits, errors, sources) on real-looking agent output, and each rule.

Commands and outputs are copied or trimmed from real runs (mini-swe-agent on SWE-bench, SWE-agent,
tau-bench) so the tests need no data folder; one test also sweeps the development trajectories
when they are present.
"""

import copy
import json
import re
import time

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from helpers import TRAJECTORIES  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemkernels.compress.blocks import Action, Block, parse_history  # noqa: E402
from gemkernels.compress.evidence import RULES, BlockFeatures, EvidenceConfig, block_features, protect  # noqa: E402
from gemkernels.compress.evidence.rules import (  # noqa: E402
    error_blocks,
    goal_blocks,
    initial_blocks,
    recent_blocks,
    source_blocks,
    state_blocks,
)
from gemkernels.compress.evidence.shell import FD_DUP, parse_shell  # noqa: E402

MINI_SWE_AGENT = TRAJECTORIES / "mini-swe-agent"


def mini(command, output="", returncode=0):
    """A mini-swe-agent step as a block: the bash command and its ``<returncode>``-tagged output."""
    observation = f"<returncode>{returncode}</returncode>\n<output>\n{output}</output>"
    return Block((0, 1), ("c0",), "", "THOUGHT: next step", (Action("bash", command),), (observation,))


def history(*steps):
    """An OpenAI history: system, task, then one tool call and its result per ``(name, arguments, output)``."""
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the bug in the username validators."}]
    for i, (name, arguments, output) in enumerate(steps):
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": output})
    return messages


def features_of(name, arguments, output=""):
    return block_features(parse_history(history((name, arguments, output))).blocks[0])


def edits(command, output=""):
    return block_features(mini(command, output)).edited_paths


# --------------------------------------------------------------------------- edits in shell commands

PATCH_SCRIPT = """cat <<'EOF' > patch_numberformat.py
import os

file_path = 'django/utils/numberformat.py'
with open(file_path, 'r') as f:
    lines = f.readlines()

new_lines = [line for line in lines]
with open(file_path, 'w') as f:
    f.writelines(new_lines)
EOF"""

UNIFIED_DIFF = """--- a/django/contrib/auth/validators.py
+++ b/django/contrib/auth/validators.py
@@ -10,1 +10,1 @@
-    regex = r'^[\\w.@+-]+$'
+    regex = r'\\A[\\w.@+-]+\\Z'
"""


@pytest.mark.parametrize("command, expected", [
    # redirections
    ("echo 'DEBUG = True' > settings_local.py", ("settings_local.py",)),
    ('echo "line" >> notes.txt', ("notes.txt",)),
    ("python reproduce_issue.py > out.log 2>&1", ("out.log",)),
    ("python run.py &> log.txt", ("log.txt",)),
    ("printf 'a\\n' >| forced.txt", ("forced.txt",)),
    ("python x.py 2> errors.txt", ("errors.txt",)),
    # tee
    ("ls -R | tee listing.txt", ("listing.txt",)),
    ("echo x | tee -a a.txt b.txt", ("a.txt", "b.txt")),
    # sed -i, real ones from SWE-bench runs
    ("sed -i '590s/cotm/cothm/' sympy/functions/elementary/hyperbolic.py",
     ("sympy/functions/elementary/hyperbolic.py",)),
    ("sed -i '275d' sklearn/mixture/base.py", ("sklearn/mixture/base.py",)),
    ("sed -i \"s/if v == \\\"NO\\\":/if v.upper() == \\\"NO\\\":/\" astropy/io/ascii/qdp.py",
     ("astropy/io/ascii/qdp.py",)),
    ("sed -i '54i\\        print(f\"DEBUG: convert called with value={value!r}\")' lib/matplotlib/category.py",
     ("lib/matplotlib/category.py",)),
    ("sed -i.bak -e 's/a/b/' -e 's/c/d/' conf.py", ("conf.py",)),
    ("sed -Ei 's/(x)+/y/' a.py b.py", ("a.py", "b.py")),
    ("sed --in-place=.orig 's/a/b/' setup.cfg", ("setup.cfg",)),
    # mv, cp, rm, touch
    ("mv django/utils/old.py django/utils/new.py", ("django/utils/old.py", "django/utils/new.py")),
    ("cp -r src/ backup/", ("backup",)),
    ("cp -t dest a.py b.py", ("dest",)),
    ("rm reproduce_issue.py test_fix.py", ("reproduce_issue.py", "test_fix.py")),
    ("rm -rf reproduction check_restify.py", ("reproduction", "check_restify.py")),
    ("touch reproduce_issue_app/__init__.py", ("reproduce_issue_app/__init__.py",)),
    ("mkdir -p pkg/sub && touch pkg/__init__.py pkg/sub/__init__.py", ("pkg/__init__.py", "pkg/sub/__init__.py")),
    # patch and git
    ("patch -p1 < fix.diff", ("fix.diff",)),
    ("patch -p1 <<'EOF'\n" + UNIFIED_DIFF + "EOF", ("django/contrib/auth/validators.py",)),
    ("patch src/app.py fix.diff", ("src/app.py",)),
    ("git apply <<'EOF'\n" + UNIFIED_DIFF + "EOF", ("django/contrib/auth/validators.py",)),
    ("git apply fix.patch", ("fix.patch",)),
    ("git checkout django/utils/html.py", ("django/utils/html.py",)),
    ("git checkout tests/i18n/patterns/tests.py && rm tests/i18n/patterns/urls/optional.py",
     ("tests/i18n/patterns/tests.py", "tests/i18n/patterns/urls/optional.py")),
    ("git checkout -- a.py b.py", ("a.py", "b.py")),
    ("git checkout .", (".",)),
    ("git restore src/x.py", ("src/x.py",)),
    ("git -C repo checkout -- setup.py", ("setup.py",)),
    # heredocs into files
    ("cat <<'EOF' > reproduce_issue.py\nfrom django.contrib.auth import validators\nprint('ok')\nEOF",
     ("reproduce_issue.py",)),
    ("cat > reproduction/index.rst << EOF\nTitle\n=====\nEOF", ("reproduction/index.rst",)),
    ("cat <<-END >> docs/notes.txt\n\tmore\n\tEND", ("docs/notes.txt",)),
    # Python
    ("python -c \"open('out.txt', 'w').write('x')\"", ("out.txt",)),
    ("python3 -c 'import os; os.remove(\"tmp.txt\")'", ("tmp.txt",)),
    ("python3 - <<'EOF'\nfrom pathlib import Path\nPath('a/b.txt').write_text('x')\nEOF", ("a/b.txt",)),
    ("python <<EOF\nimport shutil\nshutil.rmtree('build')\nEOF", ("build",)),
    ("cat <<'EOF' | python\nwith open('log.txt', mode='a') as f:\n    f.write('x')\nEOF", ("log.txt",)),
    ("python -c \"import shutil; shutil.copy('a.py', 'b.py'); shutil.move('c', 'd')\"", ("b.py", "c", "d")),
    ("python -c \"import os; os.rename('old.cfg', 'new.cfg')\"", ("old.cfg", "new.cfg")),
    ("python -c \"import os; p = os.path.join('pkg', 'mod.py'); open(p, 'x')\"", ("pkg/mod.py",)),
    ("python - <<'EOF'\nimport pathlib\nroot = pathlib.Path('src')\n(root / 'gen.py').write_text('')\nEOF",
     ("src/gen.py",)),
    ("python - <<'EOF'\nimport numpy as np\nnp.save('arr.npy', np.zeros(3))\nEOF", ("arr.npy",)),
    ("python - <<'EOF'\nimport matplotlib.pyplot as plt\nplt.savefig('reproduction.png')\nEOF", ("reproduction.png",)),
    ("python - <<'EOF'\ndf.to_csv(\"out.csv\", index=False)\nEOF", ("out.csv",)),
    ("python - <<'EOF'\ndef save(name):\n    with open(name, 'w') as f:\n        f.write('')\nEOF", ("<name>",)),
    # a script written now is usually run next: the files it writes may change too (real SWE-bench step)
    (PATCH_SCRIPT, ("patch_numberformat.py", "django/utils/numberformat.py")),
    # other tools, wrappers, nesting
    ("perl -pi -e 's/foo/bar/' lib/a.pm", ("lib/a.pm",)),
    ("curl -sL -o page.html https://example.com/docs", ("page.html",)),
    ("wget -O data.json https://example.com/api", ("data.json",)),
    ("cd /testbed && timeout 30 sed -i 's/a/b/' x.py", ("x.py",)),
    ("sudo -E env PYTHONPATH=. tee out.txt < in.txt", ("out.txt",)),
    ("bash -lc \"rm -f tmp.txt\"", ("tmp.txt",)),
    ("for f in a.py b.py; do sed -i 's/x/y/' \"$f\"; done", ("$f",)),
    ("if [ -f x.py ]; then rm x.py; fi", ("x.py",)),
    ("apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: src/app.py\n@@\n-a\n+b\n*** End Patch\nEOF",
     ("src/app.py",)),
    ("./configure &&\\\n  echo done > stamp", ("stamp",)),
])
def test_shell_writes_are_edits(command, expected):
    assert edits(command) == expected


@pytest.mark.parametrize("command", [
    "cat ./django/contrib/auth/validators.py",
    "sed -n '100,300p' pylint/checkers/similar.py",
    "nl -ba django/forms/models.py | sed -n '240,260p'",
    "grep -rn 'def _print_Mod' sympy/printing/ 2>/dev/null",
    "python reproduce_issue.py 2>&1",
    "python -m pytest tests/test_validators.py -x 2>&1 | tail -20",
    "ls -la > /dev/null 2>&1",
    "python -c \"print(open('setup.py').read())\"",
    "python -c \"import webbrowser; webbrowser.open('https://www.example.com')\"",
    "python -c \"s = 'a.py'.replace('a', 'b'); items = [1]; items.remove(1); d = {}.copy()\"",
    "echo \"a > b\" && grep -c '>' file.py",
    "cat <<'EOF'\nhello > world\nrm -rf /\nEOF",
    "git diff",
    "git checkout -b fix-validators",
    "git apply --check fix.patch",
    "git restore --staged src/x.py",
    "patch --dry-run -p1 < fix.diff",
    "mkdir -p build/reports",
    "find . -name '*.pyc' -print",
    "python3 apply_fix.py",  # a known blind spot: what a script writes is not visible in the step that runs it
    "echo \"unterminated",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached",
])
def test_reads_and_runs_are_not_edits(command):
    assert edits(command) == ()


# --------------------------------------------------------------------------- edits by tools

@pytest.mark.parametrize("name, arguments, output, expected", [
    ("str_replace_editor", {"command": "create", "path": "/testbed/reproduce.py", "file_text": "print(1)"},
     "File created successfully at: /testbed/reproduce.py", ("/testbed/reproduce.py",)),
    ("str_replace_editor", {"command": "str_replace", "path": "/testbed/django/contrib/auth/validators.py",
                            "old_str": "regex = r'^[\\w.@+-]+$'", "new_str": "regex = r'\\A[\\w.@+-]+\\Z'"},
     "The file /testbed/django/contrib/auth/validators.py has been edited.",
     ("/testbed/django/contrib/auth/validators.py",)),
    ("str_replace_editor", {"command": "insert", "path": "a.py", "insert_line": 3, "new_str": "x = 1"}, "ok",
     ("a.py",)),
    ("str_replace_based_edit_tool", {"command": "undo_edit", "path": "a.py"}, "Last edit undone", ("a.py",)),
    ("write_file", {"path": "notes/plan.md", "content": "# plan"}, "Wrote 6 bytes", ("notes/plan.md",)),
    ("edit_file", {"target_file": "src/app.py", "code_edit": "..."}, "Applied", ("src/app.py",)),
    ("Write", {"file_path": "/repo/new.py", "content": ""}, "File created", ("/repo/new.py",)),
    ("MultiEdit", {"file_path": "/repo/a.py", "edits": [{"old_string": "a", "new_string": "b"}]}, "ok",
     ("/repo/a.py",)),
    ("NotebookEdit", {"notebook_path": "analysis.ipynb", "new_source": "x = 1"}, "ok", ("analysis.ipynb",)),
    ("create_file", {"filename": "reproduce.py"}, "[File: reproduce.py (1 lines total)]", ("reproduce.py",)),
    # SWE-agent's edit names no file: the reply's "[File: ...]" header does
    ("edit", {"search": "return int(value.total_seconds() / base_unit.total_seconds())",
              "replace": "return int(round(value.total_seconds() / base_unit.total_seconds()))"},
     "Text replaced.\n[File: /testbed/src/marshmallow/fields.py (1998 lines total)]\n(1457 more lines above)",
     ("/testbed/src/marshmallow/fields.py",)),
    ("apply_patch", {"input": "*** Begin Patch\n*** Update File: src/app.py\n@@\n-a\n+b\n*** Add File: src/new.py\n"
                              "+x\n*** End Patch"}, "Done!", ("src/app.py", "src/new.py")),
    ("apply_patch", {"patch": UNIFIED_DIFF}, "Applied", ("django/contrib/auth/validators.py",)),
    ("execute_bash", {"command": "sed -i 's/a/b/' setup.py"}, "", ("setup.py",)),
    ("shell", {"command": ["bash", "-lc", "echo x > out.txt"]}, "", ("out.txt",)),
    ("ipython", {"code": "open('results.json', 'w').write('{}')"}, "", ("results.json",)),
])
def test_edit_tools(name, arguments, output, expected):
    assert features_of(name, arguments, output).edited_paths == expected


@pytest.mark.parametrize("name, arguments", [
    ("str_replace_editor", {"command": "view", "path": "/testbed/setup.py"}),
    ("read_file", {"path": "src/app.py"}),
    ("web_search", {"query": "django UsernameValidator trailing newline"}),
    ("get_reservation_details", {"reservation_id": "ZFA04Y"}),
    ("think", {"thought": "I should write the file next"}),
    ("find_file", {"file_name": "fields.py", "dir": "src"}),
    ("edit", {"search": "a", "replace": "b"}),  # no path and no [File: ...] reply: nothing to attribute
])
def test_tools_that_do_not_edit(name, arguments):
    assert features_of(name, arguments, "some output").edited_paths == ()


def test_anthropic_editor_calls_are_edits():
    messages = [
        {"role": "user", "content": "Fix it."},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Editing."},
            {"type": "tool_use", "id": "tu_1", "name": "str_replace_based_edit_tool",
             "input": {"command": "str_replace", "path": "/repo/a.py", "old_str": "x", "new_str": "y"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "Edited."}]},
    ]
    assert block_features(parse_history(messages).blocks[0]).edited_paths == ("/repo/a.py",)


def test_paths_are_normalised_and_deduplicated():
    assert edits("sed -i 's/a/b/' ./src//app.py && echo x >> src/app.py") == ("src/app.py",)


# --------------------------------------------------------------------------- errors

ASTROPY_TRACEBACK = """Traceback (most recent call last):
  File "reproduce_issue.py", line 12, in <module>
    poc = PoC(1.*u.V)
  File "/testbed/astropy/units/decorators.py", line 224, in wrapper
    return return_.to(wrapped_signature.return_annotation)
AttributeError: 'NoneType' object has no attribute 'to'
"""

PYTEST_FAILED = """============================= test session starts ==============================
collected 4 items

tests/test_validators.py ..F.                                            [100%]

=========================== short test summary info ============================
FAILED tests/test_validators.py::test_trailing_newline - AssertionError: assert True is False
========================= 1 failed, 3 passed in 0.21s ==========================
"""

DJANGO_OK = """Testing against Django installed in '/testbed/django'
Creating test database for alias 'default'...
System check identified no issues (0 silenced).
..............
----------------------------------------------------------------------
Ran 14 tests in 0.041s

OK
Destroying test database for alias 'default'...
"""


@pytest.mark.parametrize("command, output, returncode", [
    ("python3 reproduce_issue.py", ASTROPY_TRACEBACK, 1),
    ("python3 reproduce_issue.py", ASTROPY_TRACEBACK, 0),  # caught and printed: still an error record
    ("python -m pytest tests/test_validators.py", PYTEST_FAILED, 1),
    ("python -m pytest tests/test_validators.py", PYTEST_FAILED, 0),
    ("./tests/runtests.py auth_tests", "FAILED (failures=2, errors=1)", 0),
    ("./tests/runtests.py auth_tests", "ERROR: test_unicode_validator (auth_tests.test_validators.UsernameTests)", 0),
    ("python x.py", "  File \"x.py\", line 3\n    def f(\n         ^\nSyntaxError: unexpected EOF while parsing", 0),
    ("python x.py", "AssertionError", 0),
    ("python x.py", "Lasso fit with max_iter=None failed: an integer is required", 0),
    ("python x.py", "Caught expected TypeError: __init__() got an unexpected keyword argument 'max_iter'", 0),
    ("mysqlx --version", "bash: line 1: mysqlx: command not found", 127),
    ("make", "", 2),
    ("cat missing.py", "cat: missing.py: No such file or directory", 1),
    ("pip install nosuchpkg", "ERROR: Could not find a version that satisfies the requirement nosuchpkg", 1),
    ("git checkout nosuch", "error: pathspec 'nosuch' did not match any file(s) known to git", 1),
    ("grep -rn x missing_dir", "grep: missing_dir: No such file or directory", 2),  # grep's 2 is a real error
    ("./run.sh", "Segmentation fault (core dumped)", 139),
])
def test_errors_are_detected(command, output, returncode):
    assert block_features(mini(command, output, returncode)).is_error


@pytest.mark.parametrize("observation", [
    "The last command <command>./reproduction/test_issue.sh</command> timed out and has been killed.\n"
    "The output of the command was:\n <output>\nTesting HEAD request...\n</output>",
    "Process exited with exit code 1",
    "returncode: 2\nstdout: ''",
    "Exit status 1",
    "[Command finished with exit code 3]",
])
def test_exit_statuses_and_harness_messages_are_errors(observation):
    block = Block((0, 1), ("c0",), "", "", (Action("bash", "./run.sh"),), (observation,))
    assert block_features(block).is_error


@pytest.mark.parametrize("command, output, returncode", [
    ("./tests/runtests.py auth_tests.test_validators", DJANGO_OK, 0),
    ("python -m pytest -q", "5 passed in 0.10s", 0),
    ("python reproduce_issue.py", "Found 0 errors", 0),
    ("python verify_fix.py", "Setup confirmed.\nVERIFICATION SUCCESS: No errors found.", 0),
    ("ls tests/validation", "test_error_messages.py\ntest_validators.py\nimport_error_package", 0),
    ("find . -name '*error*'", "./django/forms/utils.py\n./tests/handlers/tests_custom_error_handlers.py", 0),
    ("python x.py", "errors=0 failures=0", 0),
    ("python x.py", "error_count: 0", 0),
    ("python x.py", "level is logging.ERROR", 0),
    ("python x.py", "    except KeyError:\n        pass", 0),
    ("python x.py", "/testbed/x.py:3: DeprecationWarning: use y", 0),
    ("python x.py", "returncode>0<", 0),
    # file content is not output: its error words do not make the step an error
    ("cat django/core/validators.py",
     "    raise ValidationError('error: %s' % x)\nERROR = 40\nTraceback (most recent call last)", 0),
    ("sed -n '1,40p' django/contrib/messages/constants.py", "ERROR = 40\nDEFAULT_TAGS = {ERROR: 'error'}", 0),
    ("grep -rn 'raise ValueError' sympy/core", "sympy/core/numbers.py:10: raise ValueError('Error: bad')", 0),
    # grep/diff exit 1 means "nothing found" / "files differ"
    ("grep -r 'class PathInfo' django/db/models", "", 1),
    ("pip list | grep mysql", "", 1),
    ("diff a.py b.py", "1c1\n< x\n---\n> y", 1),
])
def test_non_errors_are_not_flagged(command, output, returncode):
    assert not block_features(mini(command, output, returncode)).is_error


def test_tool_errors_without_exit_status():
    assert features_of("book_reservation", {"user_id": "mia_li_3668"}, "Error: payment method not found").is_error
    assert features_of("get_reservation_details", {"reservation_id": "X"}, "Error: reservation X not found").is_error
    assert features_of("str_replace_editor", {"command": "str_replace", "path": "a.py", "old_str": "x", "new_str": "y"},
                       "No replacement was performed, old_str `x` did not appear verbatim in a.py.").is_error
    content = '{"name": {"first_name": "Mia"}, "error_policy": "Error: is only a word here"}'
    assert not features_of("get_user_details", {"user_id": "mia_li_3668"}, content).is_error


# --------------------------------------------------------------------------- sources

@pytest.mark.parametrize("command, expected", [
    ("cat ./django/contrib/auth/validators.py", ("django/contrib/auth/validators.py",)),
    ("head -n 40 setup.py; tail -5 CHANGES.rst", ("setup.py", "CHANGES.rst")),
    ("cat -n a.py", ("a.py",)),
    ("sed -n '864,875p' sklearn/decomposition/dict_learning.py", ("sklearn/decomposition/dict_learning.py",)),
    ("nl -ba django/forms/models.py | sed -n '240,260p'", ("django/forms/models.py",)),
    ("grep -n 'def parse_http_date' django/utils/http.py", ("django/utils/http.py",)),
    ("grep -rn \"class PathInfo\" django/db/models", ("search:class PathInfo",)),
    ("rg -e 'TODO' src", ("search:TODO",)),
    ("awk 'NR>=10 && NR<=20' a.py", ("a.py",)),
    ("curl -s https://example.com/api/v1/items", ("https://example.com/api/v1/items",)),
    ("git diff --cached", ("git:diff --cached",)),
    ("ls -R | grep -i validators", ()),
    ("python reproduce_issue.py", ()),
])
def test_shell_sources(command, expected):
    assert block_features(mini(command, "some text")).sources == expected


@pytest.mark.parametrize("name, arguments, expected", [
    ("str_replace_editor", {"command": "view", "path": "/testbed/setup.py"}, ("/testbed/setup.py",)),
    ("open", {"path": "src/marshmallow/fields.py", "line_number": 1474}, ("src/marshmallow/fields.py",)),
    ("read_file", {"file_path": "README.md"}, ("README.md",)),
    ("WebFetch", {"url": "https://docs.djangoproject.com/en/4.2/ref/validators/"},
     ("https://docs.djangoproject.com/en/4.2/ref/validators/",)),
    ("browser_navigate", {"url": "https://github.com/django/django/pull/1"},
     ("https://github.com/django/django/pull/1",)),
    ("web_search", {"query": "python regex $ trailing newline"}, ("search:python regex $ trailing newline",)),
    ("Grep", {"pattern": "UsernameValidator", "path": "django"}, ("search:UsernameValidator",)),
    ("search_direct_flight", {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"},
     ('search_direct_flight:{"date": "2024-05-20", "destination": "SEA", "origin": "JFK"}',)),
    ("calculate", {"expression": "2 * 3"}, ()),
])
def test_tool_sources(name, arguments, expected):
    assert features_of(name, arguments, "page text").sources == expected


def test_source_like_needs_output_and_no_error():
    assert block_features(mini("cat a.py", "x = 1")).is_source
    assert not block_features(mini("cat a.py", "")).is_source
    assert not block_features(mini("cat a.py", "cat: a.py: No such file or directory", 1)).is_source
    assert not block_features(mini("python a.py", "x = 1")).is_source


# --------------------------------------------------------------------------- robustness


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab.py/ -'\"\\$<>|&;()`{}#=\n\t*0123456789") +
                                ["<<EOF", "EOF", "sed -i", "open(", "'w'", "cat ", "python -c ", "2>&1", "Path("]),
                max_size=60).map("".join),
       st.text(max_size=200))
def test_features_never_raise_on_odd_commands(command, output):
    for block in (mini(command, output), Block((0, 1), ("c",), "", "", (Action("x", command),), (output,))):
        features = block_features(block)
        assert isinstance(features.edited_paths, tuple) and isinstance(features.is_error, bool)
        assert all(isinstance(p, str) and p.strip() for p in features.edited_paths + features.sources)
        assert len(set(features.edited_paths)) == len(features.edited_paths)  # each path once


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["1", "23", "<", ">", "&", "-", " ", "a", "$", ">&", "2>&1"]),
                max_size=30).map("".join))
def test_fd_duplications_are_cut_as_before(text):
    """The linear pattern cuts exactly what ``\\d*[<>]&(?:\\d+|-)`` cut."""
    assert FD_DUP.sub(" ", text) == re.sub(r"\d*[<>]&(?:\d+|-)", " ", text)


def test_a_long_digit_run_in_a_command_is_read_in_linear_time():
    """``\\d*[<>]&...`` tried each digit of a run as a start, so a command with a long digit run (``echo 1...1``)
    took quadratic time: 3 s for 20,000 digits, 80 s for 100,000 (per block, every request that encodes it). The
    pattern starts a digit run only at its first digit, and cuts what the old one cut (above)."""
    started = time.perf_counter()
    parse_shell("echo " + "1" * 200_000 + " 2>&1")
    assert time.perf_counter() - started < 2.0  # linear: a tenth of a second; quadratic: minutes


@pytest.mark.parametrize("arguments", ["", "null", "[1, 2]", "{\"command\": 5}", "{\"path\": null}", "{not json"])
def test_features_tolerate_odd_arguments(arguments):
    for name in ("bash", "str_replace_editor", "apply_patch", "read_file", "anything"):
        features = block_features(Block((0, 1), ("c",), "", "", (Action(name, arguments),), ("",)))
        assert features.edited_paths == () and not features.is_error  # no usable path, empty output


def test_features_are_hashable_values():
    a, b = block_features(mini("sed -i 's/a/b/' x.py")), block_features(mini("sed -i 's/a/b/' x.py"))
    assert a == b and hash(a) == hash(b) and a.is_edit
    with pytest.raises(AttributeError):
        a.is_error = True


@pytest.mark.skipif(not MINI_SWE_AGENT.is_dir(), reason="development trajectories not present")
def test_real_mini_swe_agent_runs():
    """Every sed -i/heredoc write that ran is an edit, every non-zero exit (but grep's 1) is an error, reads are
    sources."""
    fence = re.compile(r"```bash\s*\n(.*?)\n```", re.S)
    counts = {"blocks": 0, "edit": 0, "error": 0, "source": 0}
    for path in sorted(MINI_SWE_AGENT.glob("*.json")):
        messages = json.loads(path.read_text())["messages"]
        for m, reply in zip(messages, messages[1:]):
            commands = fence.findall(m["content"]) if m["role"] == "assistant" else []
            if len(commands) != 1 or reply["role"] != "user":
                continue
            command, output = commands[0], reply["content"]
            features = block_features(Block((0, 1), ("c",), "", m["content"], (Action("bash", command),), (output,)))
            status = re.match(r"<returncode>(\d+)</returncode>", output)
            if re.match(r"(sed -i|cat <<'EOF' >) ", command) and status and status.group(1) == "0":
                assert features.is_edit, command
            if status and status.group(1) != "0" and not re.search(r"\bgrep\b[^|]*$", command):
                assert features.is_error, command
            if re.fullmatch(r"(cat|nl -ba) \S+", command) and status and status.group(1) == "0":
                assert features.is_source, command
            counts["blocks"] += 1
            counts["edit"] += features.is_edit
            counts["error"] += features.is_error
            counts["source"] += features.is_source
    assert counts["blocks"] > 1000
    assert 0.15 < counts["edit"] / counts["blocks"] < 0.45
    assert 0.03 < counts["error"] / counts["blocks"] < 0.2
    assert 0.25 < counts["source"] / counts["blocks"] < 0.6


# --------------------------------------------------------------------------- rules

def feats(n, edit=None, error=(), source=None):
    """``n`` BlockFeatures: ``edit`` maps index -> paths, ``source`` maps index -> source ids."""
    edit, source = edit or {}, source or {}
    return [BlockFeatures(edited_paths=tuple(edit.get(i, ())), is_error=i in error,
                          sources=tuple(source.get(i, ())), is_source=i in source) for i in range(n)]


def unit_rows(rows):
    x = np.asarray(rows, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("n, count, expected", [
    (10, 4, [9, 8, 7, 6]), (3, 4, [2, 1, 0]), (0, 4, []), (5, 0, []), (5, 1, [4])])
def test_recent_blocks(n, count, expected):
    assert recent_blocks(n, count) == expected


@pytest.mark.parametrize("n, count, expected", [(10, 2, [0, 1]), (1, 3, [0]), (5, 0, []), (0, 2, [])])
def test_initial_blocks(n, count, expected):
    assert initial_blocks(n, count) == expected


def test_goal_picks_the_eligible_blocks_most_similar_to_the_task():
    x = unit_rows([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0.2, 0, 1]])
    task = np.array([1.0, 0, 0])
    assert goal_blocks(x, task, np.ones(4, bool), 1) == [0]
    assert goal_blocks(x, task, np.array([False, True, True, True]), 1) == [1]
    assert goal_blocks(x, task, [2, 3], 2) == [3, 2]  # index lists work too
    assert goal_blocks(x, task, np.ones(4, bool), 3) == [0, 1, 3]
    assert goal_blocks(x, None, np.ones(4, bool), 1) == []
    assert goal_blocks(x, task, np.zeros(4, bool), 1) == []
    assert goal_blocks(x, task, np.ones(4, bool), 0) == []


def test_goal_ties_prefer_the_more_recent_block():
    x = unit_rows([[1, 0], [0, 1], [1, 0]])
    assert goal_blocks(x, np.array([1.0, 0]), np.ones(3, bool), 1) == [2]


def test_state_groups_by_path_and_keeps_the_latest_change():
    features = feats(6, edit={0: ["a.py"], 2: ["b.py"], 4: ["a.py"]})
    x = unit_rows(np.eye(6)[:, :6] + 0.01)
    query = unit_rows([[1, 0, 1, 0, 1, 0]])[0]
    picks = state_blocks(features, x, query, 3)
    assert sorted(picks) == [2, 4]  # block 0 is superseded by block 4 for a.py


def test_state_ranks_groups_against_the_state_query():
    features = feats(5, edit={0: ["a.py"], 1: ["b.py"], 2: ["c.py"], 3: ["d.py"]})
    x = unit_rows([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 0, 1]])
    assert state_blocks(features, x, np.array([0, 1.0, 0]), 2) == [1, 3]
    assert state_blocks(features, x, np.array([1.0, 0, 0]), 1) == [0]
    assert state_blocks(features, x, np.array([0, 0, 1.0]), 4) == [2, 3, 1, 0]  # ties: more recent first


def test_state_counts_a_multi_path_block_once_and_respects_count():
    features = feats(4, edit={0: ["a.py", "b.py"], 1: ["c.py"], 3: ["d.py"]})
    x = unit_rows(np.ones((4, 2)))
    assert state_blocks(features, x, None, 10) == [3, 1, 0]  # no query: most recent first
    assert state_blocks(features, x, None, 2) == [3, 1]
    assert state_blocks(features, x, None, 0) == []
    assert state_blocks(feats(3), x[:3], None, 3) == []


def test_error_blocks_respect_window_and_count():
    features = feats(14, error=(0, 3, 9, 10, 12))
    assert error_blocks(features, 8, 2) == [12, 10]
    assert error_blocks(features, 8, 5) == [12, 10, 9]
    assert error_blocks(features, 1, 5) == []  # only block 13
    assert error_blocks(features, 2, 5) == [12]
    assert error_blocks(features, 5, 5) == [12, 10, 9]  # blocks 9..13
    assert error_blocks(features, 100, 10) == [12, 10, 9, 3, 0]
    assert error_blocks(features, 8, 0) == []


def test_source_activation_threshold():
    below = feats(10, source={i: [f"f{i}.py"] for i in range(4)})
    at = feats(10, source={i: [f"f{i}.py"] for i in range(5)})
    assert source_blocks(below, 0.5, 4) == []
    assert source_blocks(at, 0.5, 4) == [4, 3, 2, 1]
    assert source_blocks(at, 0.0, 2) == [4, 3]
    assert source_blocks(feats(0), 0.5, 4) == []


def test_source_keeps_the_latest_block_per_distinct_source():
    features = feats(6, source={0: ["a.py"], 1: ["b.py"], 2: ["a.py"], 3: ["a.py", "c.py"], 5: ["a.py"]})
    assert source_blocks(features, 0.5, 10) == [5, 3, 1]  # 3 still brings c.py; 2 and 0 only repeat a.py


def test_protect_returns_every_rule_and_respects_config():
    features = feats(20, edit={2: ["a.py"], 15: ["b.py"]}, error=(18,), source={i: ["x"] for i in range(12)})
    x = unit_rows(np.random.default_rng(0).normal(size=(20, 8)))
    out = protect(features, x, x[5], x[19], np.ones(20, bool), EvidenceConfig(initial=1))
    assert tuple(out) == RULES
    assert out["recent"] == [19, 18, 17, 16] and out["goal"] == [5] and sorted(out["state"]) == [2, 15]
    assert out["error"] == [18] and out["source"] == [11] and out["initial"] == [0]
    assert protect(features, x, None, x[19], np.ones(20, bool))["goal"] == []


def test_protect_is_deterministic_and_pure():
    features = feats(12, edit={1: ["a.py"], 4: ["b.py"], 7: ["a.py"]}, error=(9,),
                     source={i: [str(i)] for i in range(7)})
    x = unit_rows(np.random.default_rng(1).normal(size=(12, 6))).astype(np.float32)
    task, query, eligible = x[2].copy(), x[11].copy(), np.ones(12, bool)
    snapshot = copy.deepcopy((features, x, task, query, eligible))
    first = protect(features, x, task, query, eligible, EvidenceConfig())
    second = protect(features, x, task, query, eligible, EvidenceConfig())
    assert first == second
    assert features == snapshot[0]
    for before, after in zip(snapshot[1:], (x, task, query, eligible)):
        np.testing.assert_array_equal(before, after)


def test_protect_rejects_mismatched_embeddings():
    with pytest.raises(ValueError, match="embeddings"):
        protect(feats(3), np.ones((4, 2)), None, None, None)


@pytest.mark.parametrize("field, value", [("recent", -1), ("error_window", 1.5), ("state", True),
                                          ("source_fraction", 1.5), ("source_fraction", -0.1)])
def test_config_is_validated(field, value):
    with pytest.raises(ValueError, match=field):
        EvidenceConfig(**{field: value})


def test_config_defaults_are_table_b1():
    cfg = EvidenceConfig()
    assert (cfg.recent, cfg.goal, cfg.state, cfg.error, cfg.error_window, cfg.source_fraction, cfg.initial) == (
        4, 1, 3, 2, 8, 0.5, 0)
    assert cfg.recent + cfg.goal + cfg.state + cfg.error + cfg.source <= 16  # defaults never grow the core


def test_end_to_end_on_a_real_looking_history():
    """A trimmed mini-swe-agent run (django-11099) in OpenAI form: features, then every rule."""
    steps = [
        ("bash", {"command": "ls -R | grep -i validators"},
         "<returncode>0</returncode>\n<output>\nvalidators.py\n</output>"),
        ("bash", {"command": "find . -name \"validators.py\" | grep \"contrib/auth\""},
         "<returncode>0</returncode>\n<output>\n./django/contrib/auth/validators.py\n</output>"),
        ("bash", {"command": "cat ./django/contrib/auth/validators.py"},
         "<returncode>0</returncode>\n<output>\nimport re\n\nclass ASCIIUsernameValidator(validators.RegexValidator):\n"
         "    regex = r'^[\\w.@+-]+$'\n</output>"),
        ("bash", {"command": "cat <<'EOF' > reproduce_issue.py\nfrom django.contrib.auth.validators import "
                             "ASCIIUsernameValidator\nASCIIUsernameValidator()('user\\n')\nprint('accepted')\nEOF"},
         "<returncode>0</returncode>\n<output>\n</output>"),
        ("bash", {"command": "python3 reproduce_issue.py"},
         "<returncode>0</returncode>\n<output>\n"
         "ASCIIUsernameValidator: FAILED - Accepted username with trailing newline\n</output>"),
        ("bash", {"command": "sed -i \"s/r'^\\[\\\\w.@+-\\]+\\$'/r'\\\\A[\\\\w.@+-]+\\\\Z'/\" "
                             "django/contrib/auth/validators.py"}, "<returncode>0</returncode>\n<output>\n</output>"),
        ("bash", {"command": "grep -n regex django/contrib/auth/validators.py"},
         "<returncode>0</returncode>\n<output>\n10:    regex = r'\\A[\\w.@+-]+\\Z'\n</output>"),
        ("bash", {"command": "python3 reproduce_issue.py"},
         "<returncode>1</returncode>\n<output>\nTraceback (most recent call last):\n"
         "django.core.exceptions.ValidationError: ['Enter a valid username.']\n</output>"),
        ("bash", {"command": "rm reproduce_issue.py"}, "<returncode>0</returncode>\n<output>\n</output>"),
        ("bash", {"command": "./tests/runtests.py auth_tests.test_validators"},
         "<returncode>0</returncode>\n<output>\n" + DJANGO_OK + "</output>"),
    ]
    parsed = parse_history(history(*steps))
    features = [block_features(b) for b in parsed.blocks]
    assert [f.edited_paths for f in features] == [
        (), (), (), ("reproduce_issue.py",), (), ("django/contrib/auth/validators.py",), (), (),
        ("reproduce_issue.py",), ()]
    assert [i for i, f in enumerate(features) if f.is_error] == [4, 7]
    assert [i for i, f in enumerate(features) if f.is_source] == [2, 6]
    x = unit_rows(np.eye(10) + 0.05)
    out = protect(features, x, x[2], x[5], np.ones(10, bool), EvidenceConfig())
    assert sorted(out["state"]) == [5, 8]  # validators.py and the script's latest change (its removal)
    assert out["error"] == [7, 4] and out["goal"] == [2] and out["source"] == []
