#pragma once

// The resolver the client calls to look up the store's host: ::getaddrinfo, unless a test has
// put a stand-in in its place. A resolver's temporary failure (EAI_AGAIN: the DNS server did not
// answer in time) cannot be made to happen on demand, so store_test swaps in one that returns it
// (tests/transports/store_test.cpp, ScopedResolver). Only tests change it, never while a client
// is connecting on another thread.

#include <netdb.h>

namespace chorus::store::detail {

using Resolver = int (*)(const char* host, const char* service, const addrinfo* hints,
                         addrinfo** found);

// The resolver clients use now.
Resolver resolver() noexcept;
// Makes `next` the resolver (nullptr: ::getaddrinfo again) and returns the one it replaces.
Resolver exchange_resolver(Resolver next) noexcept;

}  // namespace chorus::store::detail
