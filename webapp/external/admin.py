from django.contrib import admin

from webapp.external.models import ExternalRun


@admin.register(ExternalRun)
class ExternalRunAdmin(admin.ModelAdmin):
    list_display = ("run", "owner", "source", "location", "cancel_honoured", "created_at")
    list_filter = ("source",)
    raw_id_fields = ("run", "owner")
    readonly_fields = ("created_at",)
