# gpuyard: one process, fake backend and demo cluster by default.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpuyard ./gpuyard
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 gpuyard
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
COPY configs ./configs
RUN mkdir -p /app/.gpuyard && chown gpuyard /app/.gpuyard
USER gpuyard
EXPOSE 8080
ENTRYPOINT ["gpuyard"]
CMD ["serve", "--host", "0.0.0.0", "--insecure"]
