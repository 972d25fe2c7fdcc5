"""verl's tools YAML: built-in classes only, every mistake named."""

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
