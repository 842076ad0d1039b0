from django.urls import path

from .views import ReservationCalendarView, ReservationViewSet

app_name = "reservations"

reservations = ReservationViewSet.as_view({"get": "list", "post": "create"})
reservation = ReservationViewSet.as_view({"get": "retrieve"})
cancel = ReservationViewSet.as_view({"post": "cancel"})

urlpatterns = [
    path("reservations", reservations, name="reservation-list"),
    path("reservations/calendar", ReservationCalendarView.as_view(), name="reservation-calendar"),
    path("reservations/<uuid:pk>", reservation, name="reservation-detail"),
    path("reservations/<uuid:pk>/cancel", cancel, name="reservation-cancel"),
]
