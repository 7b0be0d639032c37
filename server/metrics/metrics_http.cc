#include "server/metrics/metrics_http.h"

#include "prometheus/text_serializer.h"

namespace fpa::server {

bool serve_metrics(http::Exchange& exchange, prometheus::Collectable& metrics) {
  const http::Request& r = exchange.request();
  if (r.target != "/metrics" && r.target.rfind("/metrics?", 0) != 0) return false;
  if (r.method != "GET") {
    exchange.reply(405, "text/plain; charset=utf-8", "/metrics: only GET\n");
  } else {
    exchange.reply(200, "text/plain; version=0.0.4; charset=utf-8",
                   prometheus::TextSerializer().Serialize(metrics.Collect()));
  }
  return true;
}

http::Handler metrics_handler(std::shared_ptr<prometheus::Collectable> metrics) {
  return [metrics](std::shared_ptr<http::Exchange> exchange) {
    if (!serve_metrics(*exchange, *metrics)) {
      exchange->reply(404, "text/plain; charset=utf-8", "see /metrics\n");
    }
  };
}

}  // namespace fpa::server
