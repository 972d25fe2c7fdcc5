from django.contrib import admin

from webapp.sweeps.models import Sweep, SweepMember


class SweepMemberInline(admin.TabularInline):
    model = SweepMember
    extra = 0
    raw_id_fields = ("run",)


@admin.register(Sweep)
class SweepAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "experiment", "concurrency", "created_at", "cancelled_at")
    raw_id_fields = ("owner", "experiment")
    inlines = [SweepMemberInline]
