"""Tags the database cannot hold are refused by name, in the builder and the API, before a save.

``Experiment.tags`` is varchar(50) per tag in PostgreSQL: a longer tag used to reach the
database and fail there (a 500). ``clean_tags`` now refuses it, and the empty, invisible and
surplus tags, with one message per tag under the ``tags`` field.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from engine.config import config_to_dict
from tests.webapp.api.helpers import api, errors_of  # noqa: F401  (api: a fixture)
from tests.webapp.fixtures import builder_data, tiny_config
from webapp.experiments.models import Experiment
from webapp.experiments.tags import TAG_MAX_CHARS, TAGS_MAX, TagsInvalid, clean_tags
from webapp.runs.models import Run

pytestmark = pytest.mark.django_db

LONG = "reward-shaping-ablation-with-a-much-longer-name-x51"  # 51 characters


def messages_of(tags):
    with pytest.raises(TagsInvalid) as exc:
        clean_tags(tags)
    assert {e.key for e in exc.value.errors} == {"tags"}
    return [e.message for e in exc.value.errors]


def test_the_limit_is_the_database_columns():
    assert TAG_MAX_CHARS == 50 == Experiment._meta.get_field("tags").base_field.max_length
    assert Run._meta.get_field("tags").base_field.max_length == TAG_MAX_CHARS
    assert len(LONG) == TAG_MAX_CHARS + 1


def test_good_tags_are_stripped_lower_cased_and_deduplicated():
    assert clean_tags(" GRPO, tiny ,grpo") == ["grpo", "tiny"]
    assert clean_tags(["A", " b "]) == ["a", "b"]
    assert clean_tags("") == clean_tags("   ") == clean_tags([]) == []
    assert clean_tags("x" * TAG_MAX_CHARS) == ["x" * TAG_MAX_CHARS]
    assert clean_tags("lr sweep, ünïcode, 数学") == ["lr sweep", "ünïcode", "数学"]


def test_each_bad_tag_is_named_with_the_limit_and_the_fix():
    assert messages_of(f"ok, {LONG}") == [
        "tag 'reward-shaping-ablat…' is over 50 characters (51); shorten it to 50 or fewer"
    ]
    assert messages_of("a,,b") == ["tag 2 of 3 is empty; remove the extra comma"]
    assert messages_of("a, b,") == ["tag 3 of 3 is empty; remove the extra comma"]
    assert messages_of(["a", "  "]) == ["tag 2 of 2 is empty; remove the empty item"]
    assert messages_of(["lr\tsweep"]) == [
        "tag 'lr\\tsweep' holds the invisible or control character U+0009; "
        "type the tag again without it"
    ]
    assert "U+200B" in messages_of("zero\u200bwidth")[0]
    assert "U+D800" in messages_of(["half\ud800"])[0]
    assert messages_of(["a,b"]) == [
        "tag 'a,b' holds a comma, which separates tags; send it as two items"
    ]
    many = [f"t{i}" for i in range(TAGS_MAX + 3)]
    assert messages_of(many) == ["23 tags given, 20 at most; remove 3 of them"]
    assert clean_tags(many[:TAGS_MAX] + ["T0"]) == many[:TAGS_MAX]  # duplicates do not count
    assert len(messages_of([LONG] * 1000)) == 5


def test_the_builder_shows_a_long_tag_under_the_tags_field_and_saves_nothing(client_in, owner):
    data = builder_data(tiny_config(), owner, tags=f"grpo, {LONG}")
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    message = "tag 'reward-shaping-ablat…' is over 50 characters (51); shorten it to 50 or fewer"
    assert response.context["form"].errors["tags"] == [message]
    page = response.content.decode()
    assert 'data-errors-for="tags"><li>tag &#x27;reward-shaping-ablat…&#x27; is over 50' in page
    assert not Experiment.objects.exists() and not Run.objects.exists()

    response = client_in.post(reverse("experiments:new"), {**data, "tags": "grpo,\x07bell"})
    assert response.status_code == 400
    assert "U+0007" in response.context["form"].errors["tags"][0]
    assert not Experiment.objects.exists()

    response = client_in.post(reverse("experiments:new"), {**data, "tags": "x" * TAG_MAX_CHARS})
    assert response.status_code == 302
    assert Experiment.objects.get().tags == ["x" * TAG_MAX_CHARS]  # stored whole


def test_the_builder_shows_a_bad_tag_together_with_the_configs_own_errors(client_in, owner):
    config = tiny_config(data__train_batch_size=0)
    data = builder_data(config, owner, tags=f"grpo, {LONG}")
    response = client_in.post(reverse("experiments:new"), data)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert errors["tags"] == [
        "tag 'reward-shaping-ablat…' is over 50 characters (51); shorten it to 50 or fewer"
    ]
    assert "data__train_batch_size" in errors  # not held back until the tag is fixed
    assert not Experiment.objects.exists()


def test_the_api_answers_400_under_tags_and_saves_nothing(api):  # noqa: F811
    config = config_to_dict(tiny_config())
    body = {"name": "tagged", "config": config}
    response = api.post("/experiments", {**body, "tags": ["grpo", LONG, "", "a\nb"]})
    assert response.status_code == 400, response.content
    assert [e["key"] for e in response.json()["errors"]] == ["tags", "tags", "tags"]
    messages = [e["message"] for e in response.json()["errors"]]
    assert "is over 50 characters (51); shorten it to 50 or fewer" in messages[0]
    assert messages[1] == "tag 3 of 4 is empty; remove the empty item"
    assert "U+000A" in messages[2]
    response = api.post("/experiments", {**body, "tags": ",".join(f"t{i}" for i in range(21))})
    assert response.status_code == 400
    assert errors_of(response) == {"tags": "21 tags given, 20 at most; remove 1 of them"}
    assert not Experiment.objects.exists()

    response = api.post("/experiments", {**body, "tags": ["x" * TAG_MAX_CHARS]})
    assert response.status_code == 201
    assert Experiment.objects.get().tags == ["x" * TAG_MAX_CHARS]


def test_a_run_page_refuses_a_long_tag_with_the_same_message(client_in, owner):
    from tests.webapp.fixtures import make_experiment
    from webapp.runs.services import RunAnnotationError, run_add_tags, run_create

    run = run_create(experiment=make_experiment(owner))
    with pytest.raises(RunAnnotationError, match="is over 50 characters"):
        run_add_tags(run=run, tags=f"ok, {LONG}")
    run.refresh_from_db()
    assert run.tags == []
