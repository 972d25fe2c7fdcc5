from django.contrib import admin

from webapp.alerts.models import AlertDelivery, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ("owner", "scope", "run", "experiment", "channel", "metric", "created_at")


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(admin.ModelAdmin):
    list_display = ("owner", "run", "event", "channel", "status", "attempts", "created_at")
    list_filter = ("status", "event", "channel")
    readonly_fields = [f.name for f in AlertDelivery._meta.fields]
