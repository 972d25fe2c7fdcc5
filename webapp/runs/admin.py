from django.contrib import admin

from webapp.runs.models import MetricPoint, Run, Sample


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("__str__", "owner", "status", "latest_step", "total_steps", "created_at")
    list_filter = ("status",)
    search_fields = ("experiment__name", "owner__username")
    raw_id_fields = ("experiment", "owner", "parent")
    readonly_fields = ("created_at",)


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "wall_time")
    raw_id_fields = ("run",)
    list_select_related = ("run__experiment",)


@admin.register(Sample)
class SampleAdmin(admin.ModelAdmin):
    list_display = ("run", "step", "split", "prompt_index", "sample_index", "reward")
    list_filter = ("split",)
    raw_id_fields = ("run",)
    list_select_related = ("run__experiment",)
