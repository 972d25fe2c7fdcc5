from django.contrib import admin

from webapp.projects.models import Membership, Project


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "created_at")
    inlines = [MembershipInline]
