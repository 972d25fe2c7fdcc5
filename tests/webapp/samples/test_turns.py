"""The inspector shows a multi-turn sample turn by turn: assistant, tool call, tool answer (with
the call's seconds and its error)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.samples.conftest import finished_run, records
from webapp.runs.driver_writes import samples_write
from webapp.runs.models import Sample

pytestmark = pytest.mark.django_db

TURNS = [
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "calc", "arguments": {"expr": "123+456"}}</tool_call>',
        "tool_calls": [{"name": "calc", "arguments": {"expr": "123+456"}}],
    },
    {
        "role": "tool",
        "name": "calc",
        "arguments": {"expr": "123+456"},
        "content": "579",
        "error": None,
        "seconds": 0.001,
    },
    {
        "role": "assistant",
        "content": "<tool_call>{bad</tool_call>",
        "tool_calls": [{"name": "", "arguments": {}}],
    },
    {
        "role": "tool",
        "name": "",
        "arguments": {},
        "content": "Error: the tool call is not valid JSON",
        "error": "the tool call is not valid JSON",
        "seconds": 0.0,
    },
    {"role": "assistant", "content": "579 <b>done</b>"},
]


def test_the_group_view_renders_each_turn_and_marks_tool_errors(client_in, owner):
    run = finished_run(owner)
    group = records(1, 0, [1.0, 0.0])
    group[0].turns = TURNS
    samples_write(run_id=run.pk, samples=group)
    assert Sample.objects.get(run=run, sample_index=0).turns == TURNS  # stored as written
    assert Sample.objects.get(run=run, sample_index=1).turns is None

    url = reverse("samples:group", kwargs={"run_id": run.pk}) + "?step=1&prompt=0"
    page = client_in.get(url).content.decode()
    cards = page.split('<article class="response-card')[1:]
    multi, single = cards[0], cards[1]
    roles = [part.split('"')[0] for part in multi.split('class="turn turn-')[1:]]
    assert roles == ["assistant", "tool", "assistant", "tool turn-error", "assistant"]
    assert (
        'tool call <code>calc</code> <code class="tool-args">{&quot;expr&quot;: &quot;123+456&quot;}</code>'
        in multi
    )
    assert (
        'tool answer · <code>calc</code> · <span class="tool-seconds">0.001 s</span></div>\n'
        '    \n    <pre class="turn-text">579</pre>' in multi
    )  # the call's time; a call that never ran (0 s) shows none
    assert multi.count('class="tool-seconds"') == 1
    assert multi.count('<span class="badge tool-error">tool error</span>') == 1
    assert "tool call <code>(malformed)</code>" in multi
    assert "579 &lt;b&gt;done&lt;/b&gt;" in multi  # a model's text is escaped
    # A single-turn sample keeps its plain response text.
    assert (
        'class="turn ' not in single
        and '<pre class="response-text">answer 0-1 at 1</pre>' in single
    )
