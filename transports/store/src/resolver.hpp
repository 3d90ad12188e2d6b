#pragma once

// The resolver the client calls to look up the store's host when it is a name: ::getaddrinfo,
// unless a test has put a stand-in in its place. A numeric host (127.0.0.1, ::1) never reaches
// it: the client converts it at once with ::getaddrinfo and AI_NUMERICHOST. A name is looked up
// on a helper thread, which the client waits for no longer than its deadline (Note [Store host
// lookup] in client.cpp). A resolver's temporary failure (EAI_AGAIN: the DNS server did not
// answer in time), or one that does not answer at all, cannot be made to happen on demand, so
// store_test swaps in stand-ins that do (tests/transports/store_test.cpp, ScopedFlakyResolver,
// ScopedBlockedResolver). Only tests change it. The client reads it once per try on its own
// thread and calls it on the helper thread, so a stand-in must stay callable until
// lookups_running() is 0; an address list it returns is freed with ::freeaddrinfo.

#include <netdb.h>

#include <cstddef>

namespace chorus::store::detail {

using Resolver = int (*)(const char* host, const char* service, const addrinfo* hints,
                         addrinfo** found);

// The resolver clients use now.
Resolver resolver() noexcept;
// Makes `next` the resolver (nullptr: ::getaddrinfo again) and returns the one it replaces.
Resolver exchange_resolver(Resolver next) noexcept;
// How many lookups' helper threads have not finished yet, in the whole process. One whose
// client gave up at its deadline counts until the resolver returns and its answer is freed.
std::size_t lookups_running() noexcept;

}  // namespace chorus::store::detail
