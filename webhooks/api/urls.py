from django.urls import path

from .views import WebhookDeliveryViewSet, WebhookEndpointViewSet

app_name = "webhooks"

endpoints = WebhookEndpointViewSet.as_view({"get": "list", "post": "create"})
endpoint = WebhookEndpointViewSet.as_view({"get": "retrieve", "delete": "destroy"})
rotate = WebhookEndpointViewSet.as_view({"post": "rotate_secret"})
deliveries = WebhookDeliveryViewSet.as_view({"get": "list"})
delivery = WebhookDeliveryViewSet.as_view({"get": "retrieve"})
redeliver = WebhookDeliveryViewSet.as_view({"post": "redeliver"})

urlpatterns = [
    path("webhooks", endpoints, name="endpoint-list"),
    path("webhooks/<uuid:pk>", endpoint, name="endpoint-detail"),
    path("webhooks/<uuid:pk>/rotate-secret", rotate, name="endpoint-rotate-secret"),
    path("webhooks/<uuid:endpoint_pk>/deliveries", deliveries, name="delivery-list"),
    path("webhooks/<uuid:endpoint_pk>/deliveries/<uuid:pk>", delivery, name="delivery-detail"),
    path(
        "webhooks/<uuid:endpoint_pk>/deliveries/<uuid:pk>/redeliver",
        redeliver,
        name="delivery-redeliver",
    ),
]
