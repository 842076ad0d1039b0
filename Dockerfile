# One image for web, worker, beat and the migrate job (compose / Kubernetes pick the command).
# Stage 1 installs the locked runtime dependencies (requirements.lock, hashes checked) and NVKE
# itself into a virtualenv; stage 2 copies only that virtualenv and the static files, so the
# image carries no compiler, no pip cache and none of the test or embedded-run packages.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock ./
RUN python -m venv /opt/nvke \
 && /opt/nvke/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml manage.py ./
COPY agent ./agent
COPY nvke ./nvke
COPY tenants ./tenants
COPY catalog ./catalog
COPY fleet ./fleet
COPY clusters ./clusters
COPY nodepools ./nodepools
COPY billing ./billing
COPY portal ./portal
# NVKE's own two packages: their dependencies are all in the lock (--no-deps).
RUN /opt/nvke/bin/pip install --no-deps . ./agent \
 && SECRET_KEY=collectstatic-only STATIC_ROOT=/opt/static \
    /opt/nvke/bin/python manage.py collectstatic --noinput

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PATH=/opt/nvke/bin:$PATH STATIC_ROOT=/opt/static
RUN useradd --system --uid 10001 nvke
WORKDIR /app
COPY --from=build /opt/nvke /opt/nvke
COPY --from=build /opt/static /opt/static
COPY manage.py ./
USER nvke
EXPOSE 8000
CMD ["gunicorn", "-c", "python:nvke.gunicorn_conf", "nvke.wsgi"]
