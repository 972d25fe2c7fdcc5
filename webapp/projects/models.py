"""Projects: experiments shared with members as viewers or editors, and runs shared by link.

Who may do what with which object is decided in one place, ``webapp.projects.access``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.urls import reverse


class Role(models.TextChoices):
    VIEWER = "viewer", "viewer (reads everything)"
    EDITOR = "editor", "editor (also creates, launches, cancels, tags, notes)"


class Project(models.Model):
    """A named group of experiments; its owner adds and removes members."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="owned_projects"
    )
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="project_unique_owner_name")
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("projects:detail", kwargs={"project_id": self.pk})


class Membership(models.Model):
    """One user's role in a project (the project's owner has none: it owns the project)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user__username"]
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.project_id} as {self.role}"


class RunShare(models.Model):
    """A run's read-only link for the server's logged-in users; deleting it revokes the link."""

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="share")
    token = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def get_absolute_url(self) -> str:
        return reverse("projects:shared", kwargs={"share_token": self.token})


class RunShareGrant(models.Model):
    """A user opened a run's share link: the run reads as theirs, read-only, until revoked."""

    share = models.ForeignKey(RunShare, on_delete=models.CASCADE, related_name="grants")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["share", "user"], name="runsharegrant_unique_user")
        ]
