// The grpc++ server a Door serves on: its listening address, message limits, port sharing and TLS.
//
// TLS: with a certificate and key the port speaks only TLS; with root certificates too, clients must
// present a certificate those roots issued (mutual TLS), or only may when `require_client_cert` is false.

#include "frontdoor.h"  // first: Python.h comes before any system header

#include <grpcpp/security/server_credentials.h>

namespace mcp_frontdoor {

namespace {

std::shared_ptr<grpc::ServerCredentials> Credentials(const ServerSettings& s) {
  if (s.cert_chain == nullptr || s.private_key == nullptr) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      s.root_certs == nullptr  ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
      : s.require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                              : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  if (s.root_certs != nullptr) options.pem_root_certs = s.root_certs;
  options.pem_key_cert_pairs.push_back({s.private_key, s.cert_chain});
  return grpc::SslServerCredentials(options);
}

}  // namespace

std::unique_ptr<grpc::Server> Serve(Door* door, const ServerSettings& settings, int* port) {
  grpc::ServerBuilder builder;
  *port = 0;
  builder.AddListeningPort(settings.address, Credentials(settings), port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(settings.max_receive));
  builder.SetMaxSendMessageSize(static_cast<int>(settings.max_send));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, settings.reuse_port ? 1 : 0);
  builder.RegisterCallbackGenericService(door);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server && *port == 0) {
    server->Shutdown();
    server.reset();
  }
  return server;
}

}  // namespace mcp_frontdoor
