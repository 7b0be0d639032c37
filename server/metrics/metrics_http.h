// GET /metrics in Prometheus' text format, for the HTTP servers (server/http/http_server.h): the
// metrics port serves only this, the API port serves it beside the API.
#pragma once

#include <memory>

#include "prometheus/collectable.h"
#include "server/http/http_server.h"

namespace fpa::server {

// Answers `exchange` and returns true when its target is /metrics; false leaves it unanswered.
bool serve_metrics(http::Exchange& exchange, prometheus::Collectable& metrics);

// A handler for the metrics port: /metrics, and 404 for anything else.
http::Handler metrics_handler(std::shared_ptr<prometheus::Collectable> metrics);

}  // namespace fpa::server
