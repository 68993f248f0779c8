"""The local kubelet's ``swapBehavior``, from its ``/configz``, called directly on the node.

Never through the API server's node proxy: that needs ``nodes/proxy``, which reaches every
kubelet's whole API (exec into any pod included). Called directly, the kubelet authorizes
the fine-grained ``nodes/configz`` (KEP-2862: beta and on by default since 1.33, GA in
1.36), the only permission the chart grants for it.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from webhook.agent.nodeapi import ApiError, BoundedConnection, Limit, read_body, status_message
from webhook.base.upstream import Deadline

CONFIGZ_MAX_BYTES = 1 << 20  # a kubelet configuration is a few KiB


class ConfigzError(ValueError):
    """A ``/configz`` read that did not give the kubelet's configuration."""


def configz_swap_behavior(payload: Any) -> str:
    """``kubeletconfig.memorySwap.swapBehavior`` of a kubelet ``/configz`` answer.

    ``""`` when the kubelet leaves it unset (its default, NoSwap). Anything that is not
    the shape the kubelet writes raises :class:`ConfigzError`: an answer we cannot read
    must not be mistaken for NoSwap (that would take the labels off on a hiccup).
    """
    if not isinstance(payload, Mapping):
        raise ConfigzError(f"configz is a JSON {type(payload).__name__}, not an object")
    config = payload.get("kubeletconfig")
    if not isinstance(config, Mapping):
        raise ConfigzError("configz has no kubeletconfig object")
    memory_swap = config.get("memorySwap")
    if memory_swap is None:
        return ""
    if not isinstance(memory_swap, Mapping):
        raise ConfigzError(f"kubeletconfig.memorySwap is a JSON {type(memory_swap).__name__}, "
                           "not an object")
    behavior = memory_swap.get("swapBehavior")
    if behavior is None:
        return ""
    if not isinstance(behavior, str):
        raise ConfigzError("kubeletconfig.memorySwap.swapBehavior is a JSON "
                           f"{type(behavior).__name__}, not a string")
    return behavior


class Kubelet:
    """``GET https://<address>:<port>/configz`` with the agent's token."""

    def __init__(self, address: str, port: int, context: ssl.SSLContext,
                 token: Callable[[], str | None], timeout: float = 10.0) -> None:
        self.address = address
        self.port = port
        self.context = context
        self.token = token
        self.timeout = timeout

    def swap_behavior(self) -> str:
        connection = BoundedConnection(self.address, self.port, self.context,
                                       Limit(Deadline(self.timeout, "the kubelet's /configz")))
        headers = {"Accept": "application/json"}
        token = self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            connection.request("GET", "/configz", headers=headers)
            response = connection.getresponse()
            body = read_body(response, CONFIGZ_MAX_BYTES)
        except ApiError as exc:  # over the cap, counted as it streamed
            raise ConfigzError(f"configz answer larger than {CONFIGZ_MAX_BYTES} bytes "
                               f"(HTTP {exc.status})") from exc
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ConfigzError(f"{self.address}:{self.port}: {exc or type(exc).__name__}") \
                from exc
        finally:
            connection.close()
        if response.status != 200:
            raise ConfigzError(f"HTTP {response.status}: {status_message(body)}")
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise ConfigzError(f"configz answer is not JSON: {exc}") from exc
        return configz_swap_behavior(payload)


def kubelet_context(ca_file: str | None, insecure: bool) -> ssl.SSLContext:
    """TLS to the kubelet: its serving certificate checked against ``ca_file`` (a kubelet
    whose certificate the cluster CA signed: ``serverTLSBootstrap``), or not checked at all
    (``insecure``: a self-signed kubelet certificate, as kubeadm makes by default; the
    address is the node's own, and the token sent is the agent's node-bound one)."""
    context = ssl.create_default_context(cafile=ca_file)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = False  # kubelet certificates name the node, not its IP
    return context
