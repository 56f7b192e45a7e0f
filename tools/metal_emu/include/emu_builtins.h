// Builtin kernel arguments the prepass trampolines need beyond runtime.h.
#pragma once

#include <metal_stdlib>

template <class V> V emu_group_position();
template <> inline metal::uint emu_group_position<metal::uint>() { return emu::current().group[0]; }
template <> inline metal::uint2 emu_group_position<metal::uint2>() {
  return metal::uint2(emu::current().group[0], emu::current().group[1]);
}
template <> inline metal::uint3 emu_group_position<metal::uint3>() {
  return metal::uint3(emu::current().group[0], emu::current().group[1], emu::current().group[2]);
}
