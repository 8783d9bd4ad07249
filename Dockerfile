# syntax=docker/dockerfile:1
# Regolith's container images (docs/operations.md, "Containers").
#
#   docker build -t regolith:0.1.0 .                       the runtime image (the last stage):
#                                                           regolith, regolith-metad and
#                                                           regolith-sidecar in /usr/bin
#   docker build --target vllm -t regolith-vllm:0.1.0 .    vLLM + LMCache 0.5.6 + the regolith
#                                                           Python package and mooncake.store shim
#
# Both run as user and group 10001 (regolith), the ids the Kubernetes manifests and the compose
# file give the daemons and the socket's group.

# ---- build: the three binaries, release profile -------------------------------------------
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The cargo registry and target directory are cache mounts (kept between builds, not in the
# image), so the binaries are copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p regolith-metad -p regolith-sidecar -p regolith-cli \
    && install -D -m 0755 -t /out/bin \
       target/release/regolith target/release/regolith-metad target/release/regolith-sidecar

# ---- wheels: the regolith Python package (PyO3, abi3 for Python >= 3.11) and the shim ------
FROM build AS wheels
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    python3 -m venv /venv \
    && /venv/bin/pip wheel --no-deps -w /wheels ./python ./python/mooncake-shim

# ---- vllm: an example inference image for deploy/kubernetes/examples/vllm -----------------
# pip picks the vLLM release that LMCache 0.5.6 works with; the CUDA libraries come with
# torch's wheels and the driver from the node (NVIDIA container toolkit).
FROM python:3.12-slim-bookworm AS vllm
COPY --from=wheels /wheels /wheels
RUN pip install --no-cache-dir "lmcache==0.5.6" vllm /wheels/*.whl \
    && rm -rf /wheels
RUN groupadd --system --gid 10001 regolith \
    && useradd --system --uid 10001 --gid regolith --create-home --shell /usr/sbin/nologin regolith
USER 10001:10001
ENTRYPOINT ["vllm"]

# ---- runtime: the daemons and the CLI on Debian slim (a shell for the metad start script) --
FROM debian:bookworm-slim AS runtime
RUN groupadd --system --gid 10001 regolith \
    && useradd --system --uid 10001 --gid regolith --home-dir /var/lib/regolith \
       --no-create-home --shell /usr/sbin/nologin regolith \
    && install -d -o regolith -g regolith -m 0750 /var/lib/regolith /run/regolith \
    && install -d -m 0755 /etc/regolith
COPY --from=build /out/bin/ /usr/bin/
USER 10001:10001
# metad: gRPC, metrics, HTTP metadata KV; sidecar: metrics, data plane.
EXPOSE 50051 9003 8080 9300 7600
CMD ["regolith", "--help"]
