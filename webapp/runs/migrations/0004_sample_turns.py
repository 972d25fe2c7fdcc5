from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0003_run_notes_tags"),
    ]

    operations = [
        migrations.AddField(
            model_name="sample",
            name="turns",
            field=models.JSONField(
                blank=True,
                help_text=(
                    "Multi-turn rollouts: each turn after the prompt, with tool calls and answers."
                ),
                null=True,
            ),
        ),
    ]
