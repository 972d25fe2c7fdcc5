"""A member's first experiment on their own data, in Debian's Chromium.

Upload a JSONL train set, pick the data_source that selects its reward, keep the preset's
validation set: the builder shows the upload's path in data.train_files and the run reads each
file with its own key map. An upload with no reward is refused at submit, with the error at the
top of the page. Import takes verl's key=value lines and keeps the builder when it refuses them;
the preview shows what was typed, not a default in its place.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.browser import PrivateStudioBrowserTestCase
from tests.e2e.browser import artifacts as artifacts_dir
from webapp.datasets.models import Dataset
from webapp.experiments.models import Experiment

ROWS = "".join(
    json.dumps({"question": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(1, 9)
).encode()


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(240)
class FirstOwnDataTest(PrivateStudioBrowserTestCase):
    def upload(self, data_source: str) -> Dataset:
        page = self.page
        page.goto(self.live_server_url + "/datasets/upload/")
        page.set_input_files(
            "#id_file", {"name": "sums.jsonl", "mimeType": "application/json", "buffer": ROWS}
        )
        options = page.locator("#id_data_source option").all_text_contents()
        assert any(o.startswith("gsm8k — ground_truth: the final number") for o in options)
        if data_source:
            page.select_option("#id_data_source", data_source)
        page.fill("#id_map_prompt", "question")
        page.fill("#id_map_ground_truth", "answer")
        page.click("text=Upload and preview")
        page.wait_for_url(re.compile(r"/datasets/\d+/$"))
        return Dataset.objects.order_by("-pk").first()

    def test_an_upload_beside_the_presets_validation_set_with_its_reward(self):
        from playwright.sync_api import expect

        page = self.page
        dataset = self.upload("tiny_arithmetic")
        expect(page.locator("#data-sources")).to_contain_text(
            "tiny_arithmetic: scored by the default reward"
        )

        page.goto(self.live_server_url + "/experiments/new/?preset=grpo_tiny")
        page.fill("#id_name", "my sums")
        train_files = page.locator("#id_data__train_files")
        assert train_files.input_value() == "tiny://train.parquet"
        page.select_option("#id_train_dataset", str(dataset.pk))
        expect(train_files).to_have_value(dataset.path)  # the field says what the run reads
        # The first preview loads the tokenizer that measures prompts: seconds on a cold server.
        expect(page.locator("#yaml-preview")).to_contain_text("file_key_maps", timeout=60_000)
        assert page.locator("#id_data__val_files").input_value() == "tiny://val.parquet"
        page.uncheck("#id_launch")
        page.click("text=Create experiment")
        page.wait_for_url(re.compile(r"/experiments/\d+/$"))
        data = Experiment.objects.get().config["data"]
        assert (data["train_files"], data["val_files"]) == (dataset.path, "tiny://val.parquet")
        assert data["data_key_map"] == {}
        assert data["file_key_maps"] == {
            dataset.path: {"prompt": "question", "ground_truth": "answer"}
        }
        assert data["file_data_sources"] == {dataset.path: "tiny_arithmetic"}
        assert self.errors == []

    def test_an_upload_no_reward_scores_is_refused_at_the_top_of_the_page(self):
        from playwright.sync_api import expect

        page = self.page
        dataset = self.upload("")
        expect(page.locator("#data-sources")).to_contain_text("no reward scores this data_source")
        page.goto(self.live_server_url + "/experiments/new/?preset=grpo_tiny")
        page.fill("#id_name", "no reward")
        page.select_option("#id_train_dataset", str(dataset.pk))
        page.fill("#id_data__train_batch_size", "16x")
        expect(page.locator("#yaml-preview")).to_contain_text(
            "16x ← invalid, not used", timeout=60_000
        )
        expect(page.locator("#yaml-preview")).not_to_contain_text("train_batch_size: 1024")
        page.click("text=Create experiment")
        page.wait_for_load_state()
        summary = page.locator("#error-summary")
        expect(summary).to_be_focused()
        expect(summary).to_contain_text("data_source 'sums' has no reward")
        assert summary.bounding_box()["y"] < 600  # in view, not 3,400 px down the form
        summary.locator('a[href="#id_data__train_batch_size"]').click()
        expect(page.locator("#id_data__train_batch_size")).to_be_in_viewport()
        page.screenshot(path=str(artifacts_dir() / "builder_error_summary.png"))
        assert self.errors == []

    def test_import_reads_override_lines_and_keeps_the_builder_when_it_refuses(self):
        from playwright.sync_api import expect

        page = self.page
        page.goto(self.live_server_url + "/experiments/new/?preset=grpo_tiny")
        page.fill("#id_name", "kept")
        page.fill("#id_data__train_batch_size", "16")
        page.click("details.import > summary")
        page.fill("#id_yaml_text", "data.train_batch_size=16x\ntrainer.nope=1\n")
        page.click("text=Open in builder")
        page.wait_for_load_state()
        errors = page.locator(".import-errors li")
        expect(errors).to_have_count(2)
        expect(errors.nth(0)).to_contain_text("trainer.nope=1: unknown key")
        assert page.locator("#id_data__train_batch_size").input_value() == "16"
        assert page.locator("#id_name").input_value() == "kept"

        page.fill("#id_yaml_text", "algorithm.adv_estimator=rloo\nactor_rollout_ref.rollout.n=6\n")
        page.click("text=Open in builder")
        page.wait_for_load_state()
        assert page.locator("#id_algorithm__adv_estimator").input_value() == "rloo"
        assert page.locator("#id_actor_rollout_ref__rollout__n").input_value() == "6"
        assert page.locator("#id_actor_rollout_ref__model__path").input_value() == "tiny://model"
        preview = page.locator("#yaml-preview")
        expect(preview).to_contain_text("what differs from preset grpo_tiny", timeout=60_000)
        expect(preview).to_contain_text("adv_estimator: rloo")
        expect(preview).not_to_contain_text("total_training_steps")
        page.check("#yaml-whole")
        expect(preview).to_contain_text("total_training_steps")
        assert self.errors == []
