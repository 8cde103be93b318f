"""A proxyless gRPC client (grpcio's xDS support, SotW) against a running `vxds serve`.

gRPC 1.85 sends no dynamic parameters (A67 is a draft), so vxds must run with
`--node-metadata-params env`: the client's bootstrap node metadata then picks the variant (TP2's
migration path). Two backends answer with their own names; the `env = "prod"` variant of the
route sends traffic to backend A, the other variant to B. The client, whose node says
env=prod, must land on A, and follow an update through the REST API to B.

With CERT_DIR and CLIENT, the client speaks mutual TLS (A65: bootstrap `channel_creds` of type
`tls` with certificate files from `vxds dev-certs`), and vxds runs with an identity template:
the route variants are keyed on `namespace`, the client's node metadata claims the namespace
`bank`, and its certificate says `shop`. It must land on the `shop` variant: trusted parameters
win over what a client claims.

Usage: grpc_xds_client.py ADMIN_URL XDS_PORT [CERT_DIR CLIENT]. Exits 0 on success; prints why
otherwise.
"""

import json
import os
import sys
import tempfile
import time
import urllib.request
from concurrent import futures

import grpc

SERVICE = "vxds-e2e"
METHOD = "/vxds.e2e.Echo/Who"


def start_backend(name):
    def who(request, context):
        return name.encode()

    handler = grpc.method_handlers_generic_handler(
        "vxds.e2e.Echo",
        {"Who": grpc.unary_unary_rpc_method_handler(who)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def call(admin, method, path, body):
    request = urllib.request.Request(
        admin + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read() or b"null")


# What picks the variant: (key, the value of the variant that routes to A, what the node claims).
PLAIN = ("env", "prod", "prod")
MTLS = ("namespace", "shop", "bank")


def route_variants(prod_cluster, other_cluster, key, value):
    def variant(constraints, cluster):
        return {
            "constraints": constraints,
            "resource": {
                "@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                "name": "grpc_route",
                "virtual_hosts": [
                    {
                        "name": "all",
                        "domains": [SERVICE],
                        "routes": [{"match": {"prefix": ""}, "route": {"cluster": cluster}}],
                    }
                ],
            },
        }

    return [variant(f'{key} = "{value}"', prod_cluster), variant(f'{key} != "{value}"', other_cluster)]


def cluster_ops(name, port):
    return [
        {
            "op": "put",
            "type": "cluster",
            "name": name,
            "variants": [
                {
                    "resource": {
                        "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                        "name": name,
                        "type": "EDS",
                        "eds_cluster_config": {"eds_config": {"ads": {}}},
                    }
                }
            ],
        },
        {
            "op": "put",
            "type": "endpoint",
            "name": name,
            "variants": [
                {
                    "resource": {
                        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                        "cluster_name": name,
                        "endpoints": [
                            {
                                # gRPC rejects endpoints without a locality and drops localities without a weight.
                                "locality": {},
                                "load_balancing_weight": 1,
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {"address": "127.0.0.1", "port_value": port}
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    }
                }
            ],
        },
    ]


def main():
    admin, xds_port = sys.argv[1], int(sys.argv[2])
    mtls = len(sys.argv) > 4
    key, value, claim = MTLS if mtls else PLAIN
    backend_a, port_a = start_backend("A")
    backend_b, port_b = start_backend("B")
    listener = {
        "op": "put",
        "type": "listener",
        "name": SERVICE,
        "variants": [
            {
                "resource": {
                    "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
                    "name": SERVICE,
                    "api_listener": {
                        "api_listener": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "rds": {"route_config_name": "grpc_route", "config_source": {"ads": {}}},
                            "http_filters": [
                                {
                                    "name": "router",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                                    },
                                }
                            ],
                        }
                    },
                }
            }
        ],
    }
    ops = cluster_ops("backend-a", port_a) + cluster_ops("backend-b", port_b)
    ops += [listener, {"op": "put", "type": "route", "name": "grpc_route", "variants": route_variants("backend-a", "backend-b", key, value)}]
    call(admin, "POST", "/v1/changesets", {"operations": ops})

    creds = {"type": "insecure"}
    if mtls:
        certs, client = sys.argv[3], sys.argv[4]
        creds = {
            "type": "tls",
            "config": {
                "ca_certificate_file": os.path.join(certs, "ca.pem"),
                "certificate_file": os.path.join(certs, f"{client}.pem"),
                "private_key_file": os.path.join(certs, f"{client}.key"),
            },
        }
    bootstrap = {
        "xds_servers": [{"server_uri": f"127.0.0.1:{xds_port}", "channel_creds": [creds], "server_features": ["xds_v3"]}],
        "node": {"id": "grpc-prod", "cluster": "e2e", "metadata": {key: claim}},
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(bootstrap, f)
    os.environ["GRPC_XDS_BOOTSTRAP"] = f.name

    channel = grpc.insecure_channel(f"xds:///{SERVICE}")
    who = channel.unary_unary(METHOD)

    def wait_for(expected):
        deadline = time.time() + 30
        last = None
        while time.time() < deadline:
            try:
                last = who(b"", timeout=5).decode()
                if last == expected:
                    return
            except grpc.RpcError as error:
                last = f"{error.code()}: {error.details()}"
            time.sleep(0.2)
        raise SystemExit(f"expected backend {expected}, last answer: {last}")

    wait_for("A")
    # The prod variant now routes to B: the client follows, nothing restarts.
    call(admin, "PUT", "/v1/resources/route/grpc_route", {"variants": route_variants("backend-b", "backend-a", key, value)})
    wait_for("B")
    channel.close()
    backend_a.stop(0)
    backend_b.stop(0)
    print("ok: the gRPC client received its variant and followed the update")


if __name__ == "__main__":
    main()
