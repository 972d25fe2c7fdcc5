# One image for the web app, the Celery worker and beat, and the Ray nodes.
# Build args: EXTRAS=gpu adds vLLM (CUDA machines only); PIP_EXTRA_INDEX_URL may point pip at a
# CPU-only torch index for smaller CPU images.
FROM python:3.11-slim
ARG EXTRAS=""
ARG PIP_EXTRA_INDEX_URL=""
ENV PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 RAY_AUTH_MODE=disabled POSTTRAIN_DATA_DIR=/data
# bubblewrap: the sandbox of reward code (engine/rewards/sandbox.py runs /usr/bin/bwrap).
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-client redis-tools \
    bubblewrap \
    && rm -rf /var/lib/apt/lists/*
# Every process runs as this unprivileged user: it owns /data (checkpoints, uploads, the beat
# schedule) and only reads /app, so a compromised process cannot rewrite the studio's code.
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin posttrain \
    && mkdir -p /data && chown posttrain:posttrain /data
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY engine engine
COPY workers workers
COPY webapp webapp
COPY frontend frontend
COPY rewards_contrib rewards_contrib
COPY manage.py ./
RUN pip install --no-cache-dir -c constraints.txt -e ".${EXTRAS:+[$EXTRAS]}"
USER posttrain
VOLUME /data
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "webapp.asgi:application"]
