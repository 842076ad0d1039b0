# One image for web, worker, beat and the migrate job (compose / Kubernetes pick the command).
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN useradd --system --uid 10001 nvke
COPY pyproject.toml ./
COPY agent ./agent
COPY nvke ./nvke
COPY tenants ./tenants
COPY catalog ./catalog
COPY fleet ./fleet
COPY clusters ./clusters
COPY nodepools ./nodepools
COPY billing ./billing
COPY webhooks ./webhooks
COPY portal ./portal
COPY manage.py ./
RUN pip install . ./agent && STATIC_ROOT=/app/static python manage.py collectstatic --noinput
ENV STATIC_ROOT=/app/static
USER nvke
EXPOSE 8000
CMD ["gunicorn", "-c", "python:nvke.gunicorn_conf", "nvke.wsgi"]
