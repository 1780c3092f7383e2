"""The OAuth folder's broker: ``broker`` here is a broker whose SASL_PLAINTEXT listener
offers OAUTHBEARER and trusts the module's ``issuer``. A module changes it by overriding
``oauth_options`` (``oauth.*`` keys, ``a_b`` for ``oauth.a.b``) or ``oauth_broker_settings``
(the broker's own keys)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oauth.dev_issuer import DevIssuer
from tests.broker_process import BrokerProcess
from tests.oauth_helpers import oauth_file, start_broker


@pytest.fixture(scope="module")
def oauth_options() -> dict[str, str]:
    """The broker's ``oauth.*`` keys beyond issuer, audience and tenant claim."""
    return {}


@pytest.fixture(scope="module")
def oauth_broker_settings() -> dict[str, str]:
    """The broker's own settings beyond the OAUTHBEARER listener."""
    return {}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, issuer: DevIssuer,
           oauth_options: dict[str, str],
           oauth_broker_settings: dict[str, str]) -> Iterator[BrokerProcess]:
    """A broker trusting ``issuer``, shared by the tests of one module."""
    directory = tmp_path_factory.mktemp("oauth-broker")
    process = start_broker(directory, oauth_file(directory, issuer.url, **oauth_options),
                           **oauth_broker_settings)
    yield process
    process.stop()
