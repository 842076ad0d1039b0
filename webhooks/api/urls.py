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
    path("webhooks", endpoints, name="webhook-list"),
    path("webhooks/<uuid:pk>", endpoint, name="webhook-detail"),
    path("webhooks/<uuid:pk>/rotate-secret", rotate, name="webhook-rotate-secret"),
    path("webhooks/<uuid:endpoint_pk>/deliveries", deliveries, name="webhook-delivery-list"),
    path(
        "webhooks/<uuid:endpoint_pk>/deliveries/<uuid:pk>",
        delivery,
        name="webhook-delivery-detail",
    ),
    path(
        "webhooks/<uuid:endpoint_pk>/deliveries/<uuid:pk>/redeliver",
        redeliver,
        name="webhook-delivery-redeliver",
    ),
]
