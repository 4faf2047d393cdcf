"""`routerkt rollout --gateway` and `routerkt retrain --gateway` take a URL or HOST:PORT."""
import pytest

from routerkt.urls import gateway_url

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("given", "tls", "expected"), [
    ("127.0.0.1:8080", False, "http://127.0.0.1:8080"),
    ("127.0.0.1:8080", True, "https://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/", True, "http://127.0.0.1:8080"),
    ("https://gateway.example:8443", False, "https://gateway.example:8443"),
])
def test_host_and_port_alone_get_a_scheme(given, tls, expected):
    assert gateway_url(given, tls=tls) == expected
