# PostgreSQL compresses long prompts and responses (TOAST) as they are written. Its default,
# pglz, stored 18 KB responses at about 1,600 rows/s on the studio's 2-core machine; lz4 at
# 5,500-8,700 (taking 1.7x the space): the COPY of a verl step of 8,192 4k-token responses went
# from about 5 s to about 1 s (docs/benchmarks.md, external runs). Only new values use it; a
# server built without lz4 keeps pglz.
from django.db import migrations

LZ4_AVAILABLE = (
    "EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' "
    "AND 'lz4' = ANY(enumvals))"
)


def compression(method: str) -> str:
    return f"""
DO $$ BEGIN
  IF {LZ4_AVAILABLE} THEN
    ALTER TABLE runs_sample ALTER COLUMN prompt_text SET COMPRESSION {method};
    ALTER TABLE runs_sample ALTER COLUMN response_text SET COMPRESSION {method};
  END IF;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0008_run_table_choice"),
    ]

    operations = [
        migrations.RunSQL(compression("lz4"), reverse_sql=compression("pglz")),
    ]
