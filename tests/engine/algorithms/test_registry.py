"""The registries' names are read from their decorators in the source, importing nothing."""

import pytest

from engine.algorithms.registry import registered_names


def test_names_come_in_file_then_source_order_without_importing_the_modules(tmp_path):
    (tmp_path / "b.py").write_text('@register("z")\ndef f(): ...\n')
    (tmp_path / "a.py").write_text(
        "import a_module_that_is_not_installed\n\n"
        '@other("x")\n@register("y")\ndef g(): ...\n\n@register("w")\ndef h(): ...\n'
    )
    assert registered_names(tmp_path, "register") == ("y", "w", "z")
    assert registered_names(tmp_path / "b.py", "register") == ("z",)


def test_a_name_that_is_not_a_string_literal_is_refused_with_its_line(tmp_path):
    module = tmp_path / "losses.py"
    module.write_text('NAME = "x"\n\n\n@register(NAME)\ndef f(): ...\n')
    with pytest.raises(ValueError, match=r"losses.py:4: give @register the name as one string"):
        registered_names(module, "register")
