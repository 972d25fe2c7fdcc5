from django.contrib import admin

from webapp.experiments.models import Experiment


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "preset", "archived", "updated_at")
    list_filter = ("archived", "preset")
    search_fields = ("name", "description", "owner__username")
    raw_id_fields = ("owner",)
