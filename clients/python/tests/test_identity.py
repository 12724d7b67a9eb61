import base64
import json

import pytest

from leasehold_client.errors import MissingIdentity
from leasehold_client.identity import resolve


def token(claims):
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"e30.{body}.sig"


BOUND = token({"kubernetes.io": {"namespace": "ns", "pod": {"name": "web-0", "uid": "u-1"}}})


def test_variables_win_over_the_token_and_the_token_fills_the_rest():
    env = {"POD_NAME": "from-env"}
    got = resolve(env.get, BOUND, "default")
    assert (got.name, got.namespace, got.uid) == ("from-env", "ns", "u-1")


def test_without_variables_or_a_bound_token_the_missing_variable_is_named():
    with pytest.raises(MissingIdentity, match="POD_NAME"):
        resolve({}.get, None, "default")
    with pytest.raises(MissingIdentity, match="POD_UID"):
        resolve({"POD_NAME": "p"}.get, token({"sub": "legacy"}), "default")
    assert resolve({"POD_NAME": "p", "POD_UID": "u"}.get, "garbage", "dflt").namespace == "dflt"
