from django.contrib import admin

from webapp.datasets.models import Dataset


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "format", "status", "row_count", "created_at")
    list_filter = ("format", "status")
    search_fields = ("name", "owner__username")
    raw_id_fields = ("owner",)
