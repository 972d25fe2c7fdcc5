from django.contrib import admin

from webapp.health.models import HealthAlert


@admin.register(HealthAlert)
class HealthAlertAdmin(admin.ModelAdmin):
    list_display = ("run", "check_name", "step", "message", "created_at")
    list_filter = ("check_name",)
    readonly_fields = ("run", "check_name", "step", "message", "created_at")
