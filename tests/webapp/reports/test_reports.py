"""Reports: who reads and edits one, the runs each reader sees, the notes' escaping, the sample
table, saving from the compare page, and the self-contained HTML export (the role matrix has the
reports' rows: ``tests/webapp/test_role_matrix.py``)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from django.test import Client
from django.urls import reverse

from engine.trainer.reporting import SampleRecord
from tests.webapp.fixtures import make_experiment
from tests.webapp.live import record_steps, running_run
from tests.webapp.runs.test_groups import config_run
from webapp.projects.services import experiment_move
from webapp.reports.models import Report
from webapp.reports.services import ReportError, report_create
from webapp.runs.driver_writes import samples_write
from webapp.runs.groups import run_groups_for_user
from webapp.runs.metrics import run_metric_series

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert('notes')</script>"


@pytest.fixture
def team(team, owner, other_user):
    """The web fixtures' team, with a run of the shared experiment and one of the owner's own
    (40 and 10 steps recorded) and the project's report of both."""
    project = team["project"]
    run = running_run(owner, experiment=team["experiment"])
    record_steps(run, range(1, 41))
    private = running_run(owner, experiment=make_experiment(owner, name="alice private grpo"))
    record_steps(private, range(1, 11))
    report = report_create(
        owner=owner,
        title="Week 3 findings",
        run_ids=[run.pk, private.pk],
        project=project,
        notes=f"# Findings\n\nThe **score** rises. {SCRIPT}\n\n[x](javascript:alert(1))",
        metrics=["critic/score/mean", "actor/kl_loss"],
    )
    return {
        **team,
        "mallory": other_user,
        "run": run,
        "private": private,
        "report": report,
    }


def client_of(user):
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def chart_data(content: bytes) -> dict:
    found = re.search(rb'<script id="report-data" type="application/json">(.*?)</script>', content)
    assert found, "the page embeds its charts' data"
    return json.loads(found.group(1))


def test_the_owner_and_members_read_editors_edit_others_get_404(owner, team):
    report = team["report"]
    url = report.get_absolute_url()
    assert url == f"/reports/{report.uuid}/"
    answers = {
        who: client_of(user).get(url).status_code
        for who, user in (
            ("owner", owner),
            ("editor", team["bob"]),
            ("viewer", team["carol"]),
            ("outsider", team["mallory"]),
            ("anonymous", None),
        )
    }
    assert answers == {
        "owner": 200,
        "editor": 200,
        "viewer": 200,
        "outsider": 404,
        "anonymous": 302,
    }
    edit = reverse("reports:edit", kwargs={"report_id": report.uuid})
    form = {"title": "Week 3", "notes": "edited", "metrics": "actor/kl_loss", "samples": "2"}
    assert client_of(team["carol"]).post(edit, form).status_code == 403
    assert client_of(team["mallory"]).post(edit, form).status_code == 404
    assert client_of(team["bob"]).post(edit, form).status_code == 302
    report.refresh_from_db()
    assert (report.title, report.notes, report.metrics, report.sample_count) == (
        "Week 3",
        "edited",
        ["actor/kl_loss"],
        2,
    )
    # the editor edits but does not delete; the viewer's page has no edit form
    delete = reverse("reports:delete", kwargs={"report_id": report.uuid})
    assert client_of(team["bob"]).post(delete).status_code == 403
    assert b'id="report-edit"' not in client_of(team["carol"]).get(url).content
    assert b'id="report-edit"' in client_of(team["bob"]).get(url).content


def test_a_report_outside_any_project_is_its_owners_alone(owner, team):
    mine = report_create(owner=owner, title="draft", run_ids=[team["run"].pk])
    assert client_of(owner).get(mine.get_absolute_url()).status_code == 200
    assert client_of(team["bob"]).get(mine.get_absolute_url()).status_code == 404
    listing = client_of(team["carol"]).get(reverse("reports:list")).content.decode()
    assert "Week 3 findings" in listing and "draft" not in listing
    project = reverse("projects:detail", kwargs={"project_id": team["project"].pk})
    listing = client_of(team["carol"]).get(project).content.decode()
    assert "Week 3 findings" in listing and "draft" not in listing


def test_saving_asks_an_editor_role_and_runs_the_author_may_read(owner, team):
    viewer_run = running_run(team["carol"], experiment=make_experiment(team["carol"]))
    with pytest.raises(ReportError, match="projects where you are an editor"):
        report_create(
            owner=team["carol"], title="t", run_ids=[viewer_run.pk], project=team["project"]
        )
    with pytest.raises(ReportError, match="pick runs you may read"):
        report_create(owner=team["carol"], title="t", run_ids=[team["private"].pk])
    with pytest.raises(ReportError, match="at least one run or group"):
        report_create(owner=owner, title="t")
    with pytest.raises(ReportError, match="not a metric name"):
        report_create(owner=owner, title="t", run_ids=[team["run"].pk], metrics=["a b<"])
    # an editor files reports in the project
    report = report_create(
        owner=team["bob"], title="bob's", run_ids=[team["run"].pk], project=team["project"]
    )
    assert client_of(team["carol"]).get(report.get_absolute_url()).status_code == 200


def test_a_run_the_reader_may_not_read_is_left_out_with_a_note(owner, team):
    url = team["report"].get_absolute_url()
    export = reverse("reports:export", kwargs={"report_id": team["report"].uuid})
    for response in (client_of(team["carol"]).get(url), client_of(team["carol"]).get(export)):
        content = response.content.decode()
        assert "alice private grpo" not in content
        assert f"run #{team['private'].pk}" not in content
        assert 'id="report-hidden"' in content and "1 of the report" in content
        data = chart_data(response.content)
        assert [source["label"] for source in data["sources"]] == [
            f"shared grpo · run #{team['run'].pk}"
        ]
    owners = client_of(owner).get(url).content.decode()
    assert "alice private grpo" in owners and 'id="report-hidden"' not in owners
    assert len(chart_data(owners.encode())["sources"]) == 2


def test_notes_are_markdown_with_every_tag_escaped_in_page_and_export(owner, team):
    report = team["report"]
    export = reverse("reports:export", kwargs={"report_id": report.uuid})
    for response in (
        client_of(team["carol"]).get(report.get_absolute_url()),
        client_of(team["carol"]).get(export),
    ):
        content = response.content.decode()
        notes = content[content.index('id="report-notes"') :]
        notes = notes[: notes.index("</div>")]
        assert "<h1>Findings</h1>" in notes and "<strong>score</strong>" in notes
        assert "&lt;script&gt;alert(" in notes and "<script" not in notes
        assert "javascript:" not in notes.replace("[x](javascript:alert(1))", "")
        assert 'href="javascript' not in content


class _Refs(HTMLParser):
    """Collect every src and href attribute of the page."""

    def __init__(self):
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.refs.extend(value or "" for name, value in attrs if name in ("src", "href"))


def test_the_export_is_one_self_contained_file_with_the_data(owner, team):
    response = client_of(owner).get(
        reverse("reports:export", kwargs={"report_id": team["report"].uuid})
    )
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="Week-3-findings.html"'
    content = response.content.decode()
    parser = _Refs()
    parser.feed(content)
    # No file is loaded from anywhere: no src or href to a host, or to the studio itself.
    assert not [ref for ref in parser.refs if re.match(r"(https?:)?//|/", ref)], parser.refs
    assert "<link" not in content and "<script src" not in content
    assert content.count("<script>") == 2  # Plotly's bundle and the report's script, inlined
    assert "Plotly" in content and "report-charts" in content
    data = chart_data(response.content)
    assert data["metrics"] == ["critic/score/mean", "actor/kl_loss"]
    # the charts draw the run's own series, as its page does
    expected = run_metric_series(run_id=team["run"].pk, names=data["metrics"])["series"]
    run_source = next(s for s in data["sources"] if f"#{team['run'].pk}" in s["label"])
    assert run_source["series"] == json.loads(json.dumps(expected))
    assert len(run_source["series"]["actor/kl_loss"]["step"]) == 40


def test_groups_draw_their_band_and_the_sample_table_shows_best_and_worst(owner):
    experiment = make_experiment(owner, name="seeds")
    members = [config_run(owner, experiment, n, trainer__seed=n) for n in (1, 2, 3)]
    for i, run in enumerate(members):
        record_steps(run, range(1, 6 + i))
    group = run_groups_for_user(user=owner)[0]
    samples_write(
        run_id=members[0].pk,
        samples=[
            SampleRecord(
                step=step,
                split="train",
                prompt_index=i,
                sample_index=0,
                group_id=str(i),
                data_source="d",
                prompt_text=f"prompt {step}-{i}",
                response_text=f"response {step}-{i}",
                ground_truth=None,
                reward=float(i),
            )
            for step in (1, 2)
            for i in range(5)
        ],
    )
    # from the compare page's form: runs and groups, posted to the reports list
    compare = client_of(owner).get(
        reverse("runs:compare") + f"?run={members[0].pk}&group={group.token}"
    )
    assert b'id="compare-save-report"' in compare.content
    response = client_of(owner).post(
        reverse("reports:list"),
        {"title": "seeds", "run": [members[0].pk], "group": [group.token]},
    )
    report = Report.objects.get(title="seeds")
    assert response.status_code == 302 and response["Location"] == report.get_absolute_url()
    page = client_of(owner).get(report.get_absolute_url()).content.decode()
    band = chart_data(page.encode())["sources"][1]
    assert band["band"] is True
    series = band["series"]["critic/score/mean"]
    assert series["n"] == [3, 3, 3, 3, 3, 2, 1]  # members of 5, 6 and 7 steps
    # the 3 best and worst at the latest step (2) with samples: rewards 4, 3, 2 and 1, 0
    rows = re.findall(
        r"<td>(best|worst)</td><td>([\d.]+)</td><td class=\"sample-text\">([^<]*)", page
    )
    assert [(rank, float(reward), prompt) for rank, reward, prompt in rows] == [
        ("best", 4.0, "prompt 2-4"),
        ("best", 3.0, "prompt 2-3"),
        ("best", 2.0, "prompt 2-2"),
        ("worst", 1.0, "prompt 2-1"),
        ("worst", 0.0, "prompt 2-0"),
    ]


def test_a_group_shows_the_reader_only_the_members_they_may_read(owner, team):
    shared = make_experiment(owner, name="seeds in the project")
    experiment_move(experiment=shared, by=owner, project=team["project"])
    private = make_experiment(owner, name="seeds kept private")
    seen = config_run(owner, shared, 1, trainer__seed=1)
    unseen = config_run(owner, private, 2, trainer__seed=2)
    record_steps(seen, range(1, 4))
    record_steps(unseen, range(1, 7))
    [group] = [g for g in run_groups_for_user(user=owner) if seen in g.runs]
    assert {run.pk for run in group.runs} == {seen.pk, unseen.pk}
    report = report_create(
        owner=owner, title="seeds", group_tokens=[group.token], project=team["project"]
    )
    page = client_of(team["carol"]).get(report.get_absolute_url()).content.decode()
    [band] = chart_data(page.encode())["sources"]
    assert band["members"] == f"#{seen.pk}"  # one member: no seed varies
    assert band["series"]["critic/score/mean"]["step"] == [1, 2, 3]  # not the private run's 6
    assert "seeds kept private" not in page and f"#{unseen.pk}" not in page
    owners = chart_data(client_of(owner).get(report.get_absolute_url()).content)["sources"]
    assert owners[0]["series"]["critic/score/mean"]["n"] == [2, 2, 2, 1, 1, 1]
