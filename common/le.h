/*
 * le: little-endian integers in byte buffers, whatever the host -- the
 * explicit encodings the project writes to disk and blobs (the store's
 * layout metadata, laia's and the oracle's saved state, the dense state of
 * a checkpoint) -- and the set digest's lanes: a 32-byte SHA-256 read as
 * four little-endian uint64 lanes, summed lane by lane mod 2^64, so that a
 * sum over rows (or over servers) does not depend on their order or split.
 */
#ifndef CHANTER_LE_H
#define CHANTER_LE_H

#include <stdint.h>

static inline void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t get_le32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static inline uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* lane += the four lanes of the 32 bytes h. */
static inline void le_lanes_add(uint64_t lane[4], const uint8_t h[32]) {
  for (int l = 0; l < 4; l++) lane[l] += get_le64(h + 8 * l);
}
/* The four lanes back as 32 bytes. */
static inline void le_lanes_put(uint8_t out[32], const uint64_t lane[4]) {
  for (int l = 0; l < 4; l++) put_le64(out + 8 * l, lane[l]);
}

#endif
