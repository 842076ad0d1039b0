"""Tenant portal URLs, mounted at ``/``."""

from django.urls import path

import nvke.converters  # noqa: F401  (registers <username:…> and <token:…>)

from .views import account, activity, auth, cluster_lists, clusters, invitations, usage

app_name = "portal"

CLUSTER = "clusters/<uuid:cluster_id>"
POOL = CLUSTER + "/nodepools/<uuid:pool_id>"

urlpatterns = [
    path("", auth.home, name="home"),
    path("login", auth.LoginView.as_view(), name="login"),
    path("logout", auth.LogoutView.as_view(), name="logout"),
    path("password-reset", auth.PasswordResetView.as_view(), name="password-reset"),
    path("password-reset/sent", auth.PasswordResetDoneView.as_view(), name="password-reset-done"),
    path(
        "password-reset/<uidb64>/<token>",
        auth.PasswordResetConfirmView.as_view(),
        name="password-reset-confirm",
    ),
    path(
        "password-reset/done",
        auth.PasswordResetCompleteView.as_view(),
        name="password-reset-complete",
    ),
    path("invite/<token:token>", invitations.invitation_accept, name="invite"),
    path("tenant/choose", account.tenant_choose, name="tenant-choose"),
    path("activity", activity.tenant_activity, name="activity"),
    path("clusters", clusters.cluster_list, name="cluster-list"),
    path("clusters/new", clusters.cluster_create, name="cluster-create"),
    path(CLUSTER, clusters.cluster_detail, name="cluster-detail"),
    path(CLUSTER + "/activity", activity.cluster_activity, name="cluster-activity"),
    path(CLUSTER + "/upgrade", clusters.cluster_upgrade, name="cluster-upgrade"),
    path(CLUSTER + "/delete", clusters.cluster_delete, name="cluster-delete"),
    path(CLUSTER + "/nodepools", cluster_lists.nodepool_list, name="nodepool-list"),
    path(CLUSTER + "/operations", cluster_lists.operation_list, name="operation-list"),
    path(CLUSTER + "/nodepools/new", clusters.nodepool_create, name="nodepool-create"),
    path(POOL, clusters.nodepool_detail, name="nodepool-detail"),
    path(POOL + "/activity", activity.nodepool_activity, name="nodepool-activity"),
    path(POOL + "/scale", clusters.nodepool_scale, name="nodepool-scale"),
    path(POOL + "/isolation", clusters.nodepool_isolation, name="nodepool-isolation"),
    path(POOL + "/upgrade", clusters.nodepool_upgrade, name="nodepool-upgrade"),
    path(POOL + "/resume-upgrade", clusters.nodepool_resume_upgrade, name="nodepool-resume"),
    path(POOL + "/delete", clusters.nodepool_delete, name="nodepool-delete"),
    path(POOL + "/nodes/<uuid:node_id>", clusters.node_detail, name="node-detail"),
    path("api-keys", account.api_keys, name="api-keys"),
    path("api-keys/<token:prefix>/revoke", account.api_key_revoke, name="api-key-revoke"),
    path("members", account.member_list, name="members"),
    path(
        "members/invitations/<uuid:invitation_id>/revoke",
        invitations.invitation_revoke,
        name="invitation-revoke",
    ),
    path("members/<username:username>/role", account.member_role, name="member-role"),
    path("members/<username:username>/remove", account.member_remove, name="member-remove"),
    path("quotas", account.quota_page, name="quotas"),
    path("audit", account.audit_log, name="audit"),
    path("usage", usage.usage_page, name="usage"),
    path("usage/refresh", usage.usage_refresh, name="usage-refresh"),
    path("invoices", usage.invoice_list, name="invoices"),
    path("invoices/<uuid:invoice_id>", usage.invoice_detail, name="invoice-detail"),
]
