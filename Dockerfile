# vxds, built from this repository: `docker compose up` runs it with Postgres.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p vxds \
    && cp target/release/vxds /usr/local/bin/vxds

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --home-dir /var/lib/vxds vxds
COPY --from=build /usr/local/bin/vxds /usr/local/bin/vxds
USER vxds
WORKDIR /var/lib/vxds
# The admin API and the xDS server.
EXPOSE 8080 18000
ENV VXDS_ADMIN_ADDR=0.0.0.0:8080 \
    VXDS_XDS_ADDR=0.0.0.0:18000
# The admin API beyond loopback is HTTPS (vxds refuses plaintext there unless told).
HEALTHCHECK --interval=5s --timeout=3s --retries=5 CMD curl -fsSk https://127.0.0.1:8080/readyz || curl -fsS http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["vxds"]
CMD ["serve"]
