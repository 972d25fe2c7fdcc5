"""verl's tools YAML: built-in classes and installed tool modules only, every mistake named."""

from __future__ import annotations

import pytest

from engine.tools import load_tools
from engine.tools.calculator import CalculatorTool

CALCULATOR = """tools:
  - class_name: {cls}
    config: {{type: native, timeout_s: 2}}
    tool_schema:
      type: function
      function:
        name: calc
        description: Evaluate arithmetic.
        parameters: {{type: object, properties: {{expression: {{type: string}}}}}}
"""


def write(tmp_path, text):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("cls", ["calculator", "engine.tools.calculator.CalculatorTool"])
def test_a_builtin_tool_loads_by_name_or_class_path(tmp_path, cls):
    tools = load_tools(write(tmp_path, CALCULATOR.format(cls=cls)))
    assert list(tools) == ["calc"]
    assert isinstance(tools["calc"], CalculatorTool)
    assert tools["calc"].timeout_s == 2.0
    assert tools["calc"].execute({"expression": "2+3"}, {}) == "5"


def test_an_import_path_is_never_imported(tmp_path):
    # verl's own example names a class by import path; here that would be running YAML as code.
    path = write(tmp_path, CALCULATOR.format(cls="os.system"))
    with pytest.raises(ValueError, match=r"'os.system' is not a built-in tool.*calculator"):
        load_tools(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tools: []\n", "non-empty list under 'tools:'"),
        ("tools: [1]\n", "must be a mapping"),
        ("tools: [{class_name: calculator}]\n", "tool_schema must be"),
        (
            "tools: [{class_name: calculator, tool_schema: {type: function, function: {}}}]\n",
            "needs a string 'name'",
        ),
        (": :\n", "not valid YAML"),
    ],
)
def test_malformed_files_are_named(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        load_tools(write(tmp_path, text))


def test_a_bad_timeout_and_a_duplicate_name_are_refused(tmp_path):
    bad = CALCULATOR.format(cls="calculator").replace("timeout_s: 2", "timeout_s: 0")
    with pytest.raises(ValueError, match="timeout_s=0"):
        load_tools(write(tmp_path, bad))
    twice = CALCULATOR.format(cls="calculator")
    twice += twice.split("tools:\n", 1)[1]
    with pytest.raises(ValueError, match="two tools are named 'calc'"):
        load_tools(write(tmp_path, twice))


def test_a_missing_file_names_the_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="multi_turn.tool_config_path"):
        load_tools(tmp_path / "missing.yaml")


# -- tools an administrator installed ------------------------------------------------------------
WORDS_TOOL = """
from engine.tools import Tool


class WordCountTool(Tool):
    def execute(self, arguments, extra_info):
        return str(len(arguments["text"].split()))


class NotATool:
    pass
"""

WORDS = """tools:
  - class_name: {cls}
    config: {{timeout_s: 3}}
    tool_schema:
      type: function
      function: {{name: words, description: Count words., parameters: {{type: object}}}}
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A folder of installed tool modules, named by POSTTRAIN_TOOL_MODULES_DIR."""
    folder = tmp_path / "installed"
    (folder / "text").mkdir(parents=True)
    (folder / "words.py").write_text(WORDS_TOOL)
    (folder / "text" / "counting.py").write_text(WORDS_TOOL)
    (folder / "broken.py").write_text("raise RuntimeError('no licence key')\n")
    monkeypatch.setenv("POSTTRAIN_TOOL_MODULES_DIR", str(folder))
    return folder


@pytest.mark.parametrize("cls", ["words.WordCountTool", "text.counting.WordCountTool"])
def test_a_tool_class_from_the_installed_modules_folder_loads_and_runs(tmp_path, installed, cls):
    tools = load_tools(write(tmp_path, WORDS.format(cls=cls)))
    assert tools["words"].timeout_s == 3.0
    assert tools["words"].execute({"text": "one two three"}, {}) == "3"


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        ("os.system", r"no module os.py among the installed tools"),  # never the stdlib's os
        ("subprocess.Popen", r"no module subprocess.py among the installed tools"),
        ("words.NotATool", r"has no class NotATool deriving from engine.tools.Tool"),
        ("words.Missing", r"has no class Missing deriving from engine.tools.Tool"),
        ("broken.Tool", r"broken.py failed to import: RuntimeError: no licence key"),
        ("..words.WordCountTool", r"neither a built-in tool .* nor module.ClassName"),
        ("WordCountTool", r"neither a built-in tool .* nor module.ClassName"),
    ],
)
def test_only_tool_classes_inside_the_installed_folder_are_imported(
    tmp_path, installed, cls, message
):
    with pytest.raises(ValueError, match=message):
        load_tools(write(tmp_path, WORDS.format(cls=cls)))


def test_a_link_out_of_the_installed_folder_is_not_followed(tmp_path, installed):
    outside = tmp_path / "outside.py"
    outside.write_text(WORDS_TOOL)
    (installed / "linked.py").symlink_to(outside)
    with pytest.raises(ValueError, match="no module linked.py among the installed tools"):
        load_tools(write(tmp_path, WORDS.format(cls="linked.WordCountTool")))


def test_without_an_installed_folder_a_module_path_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("POSTTRAIN_TOOL_MODULES_DIR", raising=False)
    with pytest.raises(ValueError, match="POSTTRAIN_TOOL_MODULES_DIR names"):
        load_tools(write(tmp_path, WORDS.format(cls="words.WordCountTool")))
