/* Input to bindgen and the C shim for dpdk-sys.
 *
 * DPDK's fast path (rx/tx burst, mbuf alloc/free, rte_errno, rte_lcore_id...)
 * is static inline or a macro, so Rust cannot link to it. shim.c exports
 * non-inline wrappers named dpdk_sys_*; their prototypes are here so bindgen
 * generates matching Rust declarations. Macro constants built from
 * function-like macros (RTE_BIT64...) are captured as `static const` values
 * that clang evaluates, so no numbers are copied by hand and the crate builds
 * against whichever DPDK pkg-config finds. */
#ifndef DPDK_SYS_WRAPPER_H
#define DPDK_SYS_WRAPPER_H

#include <stdint.h>
#include <stdio.h>

#include <rte_config.h>
#include <rte_common.h>
#include <rte_errno.h>
#include <rte_eal.h>
#include <rte_lcore.h>
#include <rte_launch.h>
#include <rte_log.h>
#include <rte_alarm.h>
#include <rte_cycles.h>
#include <rte_dev.h>
#include <rte_memory.h>
#include <rte_memzone.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ether.h>
#include <rte_ethdev.h>
#include <rte_flow.h>
#include <rte_version.h>

/* ---- constants (renamed by build.rs: DPDK_SYS_C_X -> X) ---- */
#define DPDK_SYS_U64(name) static const uint64_t DPDK_SYS_C_##name = (uint64_t)(name);
#define DPDK_SYS_U32(name) static const uint32_t DPDK_SYS_C_##name = (uint32_t)(name);
#define DPDK_SYS_U16(name) static const uint16_t DPDK_SYS_C_##name = (uint16_t)(name);

DPDK_SYS_U64(RTE_ETH_RSS_IPV4)
DPDK_SYS_U64(RTE_ETH_RSS_FRAG_IPV4)
DPDK_SYS_U64(RTE_ETH_RSS_NONFRAG_IPV4_TCP)
DPDK_SYS_U64(RTE_ETH_RSS_NONFRAG_IPV4_UDP)
DPDK_SYS_U64(RTE_ETH_RSS_NONFRAG_IPV4_OTHER)
DPDK_SYS_U64(RTE_ETH_RSS_IPV6)
DPDK_SYS_U64(RTE_ETH_RSS_NONFRAG_IPV6_TCP)
DPDK_SYS_U64(RTE_ETH_RSS_NONFRAG_IPV6_UDP)
DPDK_SYS_U64(RTE_ETH_RSS_L2_PAYLOAD)
DPDK_SYS_U64(RTE_ETH_RSS_ETH)
DPDK_SYS_U64(RTE_ETH_RSS_IP)
DPDK_SYS_U64(RTE_ETH_RSS_TCP)
DPDK_SYS_U64(RTE_ETH_RSS_UDP)
DPDK_SYS_U64(RTE_ETH_RSS_SCTP)
DPDK_SYS_U64(RTE_ETH_RSS_L3_SRC_ONLY)
DPDK_SYS_U64(RTE_ETH_RSS_L3_DST_ONLY)
DPDK_SYS_U64(RTE_ETH_RSS_L4_SRC_ONLY)
DPDK_SYS_U64(RTE_ETH_RSS_L4_DST_ONLY)

DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_VLAN_STRIP)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_IPV4_CKSUM)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_UDP_CKSUM)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_TCP_CKSUM)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_CHECKSUM)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_TCP_LRO)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_SCATTER)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_TIMESTAMP)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_KEEP_CRC)
DPDK_SYS_U64(RTE_ETH_RX_OFFLOAD_RSS_HASH)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_VLAN_INSERT)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_IPV4_CKSUM)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_UDP_CKSUM)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_TCP_CKSUM)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_TCP_TSO)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_UDP_TSO)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_MT_LOCKFREE)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_MULTI_SEGS)
DPDK_SYS_U64(RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE)

DPDK_SYS_U64(RTE_MBUF_F_RX_VLAN)
DPDK_SYS_U64(RTE_MBUF_F_RX_RSS_HASH)
DPDK_SYS_U64(RTE_MBUF_F_RX_FDIR)
DPDK_SYS_U64(RTE_MBUF_F_RX_IP_CKSUM_MASK)
DPDK_SYS_U64(RTE_MBUF_F_RX_IP_CKSUM_UNKNOWN)
DPDK_SYS_U64(RTE_MBUF_F_RX_IP_CKSUM_BAD)
DPDK_SYS_U64(RTE_MBUF_F_RX_IP_CKSUM_GOOD)
DPDK_SYS_U64(RTE_MBUF_F_RX_IP_CKSUM_NONE)
DPDK_SYS_U64(RTE_MBUF_F_RX_L4_CKSUM_MASK)
DPDK_SYS_U64(RTE_MBUF_F_RX_L4_CKSUM_UNKNOWN)
DPDK_SYS_U64(RTE_MBUF_F_RX_L4_CKSUM_BAD)
DPDK_SYS_U64(RTE_MBUF_F_RX_L4_CKSUM_GOOD)
DPDK_SYS_U64(RTE_MBUF_F_RX_L4_CKSUM_NONE)
DPDK_SYS_U64(RTE_MBUF_F_RX_LRO)
DPDK_SYS_U64(RTE_MBUF_F_TX_TCP_SEG)
DPDK_SYS_U64(RTE_MBUF_F_TX_L4_NO_CKSUM)
DPDK_SYS_U64(RTE_MBUF_F_TX_TCP_CKSUM)
DPDK_SYS_U64(RTE_MBUF_F_TX_UDP_CKSUM)
DPDK_SYS_U64(RTE_MBUF_F_TX_L4_MASK)
DPDK_SYS_U64(RTE_MBUF_F_TX_IP_CKSUM)
DPDK_SYS_U64(RTE_MBUF_F_TX_IPV4)
DPDK_SYS_U64(RTE_MBUF_F_TX_IPV6)
DPDK_SYS_U64(RTE_MBUF_F_TX_VLAN)
DPDK_SYS_U64(RTE_MBUF_F_EXTERNAL)
DPDK_SYS_U64(RTE_MBUF_F_INDIRECT)

DPDK_SYS_U32(RTE_MBUF_DEFAULT_DATAROOM)
DPDK_SYS_U32(RTE_MBUF_DEFAULT_BUF_SIZE)
DPDK_SYS_U32(RTE_PKTMBUF_HEADROOM)
DPDK_SYS_U32(RTE_MEMPOOL_CACHE_MAX_SIZE)
DPDK_SYS_U32(RTE_MAX_ETHPORTS)
DPDK_SYS_U32(RTE_MAX_LCORE)
DPDK_SYS_U32(RTE_MAX_QUEUES_PER_PORT)
DPDK_SYS_U32(RTE_ETH_NAME_MAX_LEN)
DPDK_SYS_U32(RTE_ETH_XSTATS_NAME_SIZE)
DPDK_SYS_U32(RTE_ETHER_ADDR_LEN)
DPDK_SYS_U32(RTE_ETHER_MTU)
DPDK_SYS_U32(RTE_ETHER_HDR_LEN)
DPDK_SYS_U32(RTE_ETHER_CRC_LEN)
DPDK_SYS_U32(RTE_ETH_SPEED_NUM_NONE)
DPDK_SYS_U32(RTE_ETH_SPEED_NUM_UNKNOWN)
DPDK_SYS_U32(LCORE_ID_ANY)
DPDK_SYS_U32(SOCKET_ID_ANY)
DPDK_SYS_U32(RTE_VERSION)
DPDK_SYS_U64(RTE_BAD_IOVA)
DPDK_SYS_U32(RTE_MBUF_PRIV_ALIGN)
/** sizeof(struct rte_mbuf): the private area starts right after it. */
static const uint32_t DPDK_SYS_C_MBUF_STRUCT_SIZE = (uint32_t)sizeof(struct rte_mbuf);

/* ---- shim: plain structs where DPDK uses bitfields ---- */

/** Link state without the bitfields of struct rte_eth_link. */
struct dpdk_sys_link {
	uint32_t speed_mbps;
	uint8_t up;
	uint8_t full_duplex;
	uint8_t autoneg;
};

/* ---- shim functions (shim.c) ---- */
int dpdk_sys_errno(void);
void dpdk_sys_set_errno(int value);
unsigned dpdk_sys_lcore_id(void);
/* Flush the calling lcore's default cache of every mempool back to its ring (before
 * the lcore id is released: a later owner of the id, or none, would strand them). */
void dpdk_sys_flush_lcore_caches(void);
uint64_t dpdk_sys_rdtsc(void);
const char *dpdk_sys_version(void);

uint16_t dpdk_sys_eth_rx_burst(uint16_t port_id, uint16_t queue_id,
			       struct rte_mbuf **rx_pkts, uint16_t nb_pkts);
uint16_t dpdk_sys_eth_tx_burst(uint16_t port_id, uint16_t queue_id,
			       struct rte_mbuf **tx_pkts, uint16_t nb_pkts);
int dpdk_sys_eth_link_get_nowait(uint16_t port_id, struct dpdk_sys_link *out);

struct rte_mbuf *dpdk_sys_pktmbuf_alloc(struct rte_mempool *mp);
int dpdk_sys_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs,
				unsigned count);
void dpdk_sys_pktmbuf_free(struct rte_mbuf *m);
void dpdk_sys_pktmbuf_free_bulk(struct rte_mbuf **mbufs, unsigned count);
struct rte_mbuf *dpdk_sys_pktmbuf_alloc_frame(struct rte_mempool *mp, uint16_t len,
					      uint64_t ol_flags, uint64_t l2_len,
					      uint64_t l3_len, uint64_t l4_len, char **data);
char *dpdk_sys_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len);
char *dpdk_sys_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
char *dpdk_sys_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);
int dpdk_sys_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
int dpdk_sys_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail);
void *dpdk_sys_pktmbuf_mtod(struct rte_mbuf *m);
uint16_t dpdk_sys_pktmbuf_data_len(const struct rte_mbuf *m);
uint32_t dpdk_sys_pktmbuf_pkt_len(const struct rte_mbuf *m);
uint16_t dpdk_sys_pktmbuf_nb_segs(const struct rte_mbuf *m);
struct rte_mbuf *dpdk_sys_pktmbuf_next(const struct rte_mbuf *m);
uint16_t dpdk_sys_pktmbuf_headroom(const struct rte_mbuf *m);
uint16_t dpdk_sys_pktmbuf_tailroom(const struct rte_mbuf *m);
uint16_t dpdk_sys_pktmbuf_data_room_size(struct rte_mempool *mp);
uint16_t dpdk_sys_pktmbuf_priv_size(struct rte_mempool *mp);
struct rte_mempool *dpdk_sys_mbuf_pool(const struct rte_mbuf *m);
uint16_t dpdk_sys_mbuf_refcnt_read(const struct rte_mbuf *m);
void dpdk_sys_pktmbuf_refcnt_update(struct rte_mbuf *m, int16_t v);
uint64_t dpdk_sys_mbuf_ol_flags(const struct rte_mbuf *m);
/* 1 if the segment's data buffer is its own to write (given mbuf refcnt 1): a direct
 * mbuf, or a pinned external buffer no indirect mbuf is attached to. */
int dpdk_sys_mbuf_owns_buf(const struct rte_mbuf *m);
void dpdk_sys_mbuf_set_ol_flags(struct rte_mbuf *m, uint64_t flags);
void dpdk_sys_mbuf_set_tx_offload(struct rte_mbuf *m, uint64_t l2_len,
				  uint64_t l3_len, uint64_t l4_len, uint64_t tso_segsz);
uint32_t dpdk_sys_mbuf_rss_hash(const struct rte_mbuf *m);
uint32_t dpdk_sys_mbuf_packet_type(const struct rte_mbuf *m);
struct rte_mbuf_ext_shared_info *dpdk_sys_pktmbuf_ext_shinfo_init_helper(
	void *buf_addr, uint16_t *buf_len, rte_mbuf_extbuf_free_callback_t free_cb,
	void *fcb_opaque);
void dpdk_sys_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr,
				    rte_iova_t buf_iova, uint16_t buf_len,
				    struct rte_mbuf_ext_shared_info *shinfo);

/* ---- external memory (zero-copy buffers owned outside DPDK) ---- */

/** The mbuf fields zero-copy conversion reads, in one call. */
struct dpdk_sys_mbuf_view {
	void *buf_addr;
	uint64_t buf_iova;
	struct rte_mempool *pool;
	uint32_t pkt_len;
	uint16_t buf_len;
	uint16_t data_off;
	uint16_t data_len;
	uint16_t priv_size;
	uint16_t nb_segs;
	uint16_t refcnt;
	/* dpdk_sys_mbuf_owns_buf(m): the segment owns its data buffer. */
	uint16_t owns_buf;
};
void dpdk_sys_mbuf_view(const struct rte_mbuf *m, struct dpdk_sys_mbuf_view *out);

/* rte_pktmbuf_pool_create_extbuf (experimental in 22.11/23.11). */
struct rte_mempool *dpdk_sys_pktmbuf_pool_create_extbuf(
	const char *name, unsigned int n, unsigned int cache_size,
	uint16_t priv_size, uint16_t data_room_size, int socket_id,
	const struct rte_pktmbuf_extmem *ext_mem, unsigned int ext_num);

/* Fills a caller-owned shared-info block: callback, argument, refcnt 1. */
void dpdk_sys_ext_shinfo_init(struct rte_mbuf_ext_shared_info *shinfo,
			      rte_mbuf_extbuf_free_callback_t free_cb,
			      void *fcb_opaque);
uint16_t dpdk_sys_ext_shinfo_refcnt(const struct rte_mbuf_ext_shared_info *shinfo);

/* Cuts a chain after its first segment: `m` becomes a one-segment packet,
 * the rest (a valid chain with its own nb_segs/pkt_len) is returned, NULL if
 * there was none. Both must be owned exclusively by the caller. */
struct rte_mbuf *dpdk_sys_pktmbuf_unchain(struct rte_mbuf *m);

/* rte_dev_dma_map / unmap (experimental) on the device behind an ethdev
 * port. Return 0 or a negative errno. */
int dpdk_sys_port_dma_map(uint16_t port_id, void *addr, uint64_t iova, size_t len);
int dpdk_sys_port_dma_unmap(uint16_t port_id, void *addr, uint64_t iova, size_t len);

/* rte_memzone_reserve_aligned on any socket: `len` bytes of EAL memory aligned to
 * `align`. Returns the memzone (NULL with rte_errno set) and writes its address and
 * IOVA (RTE_BAD_IOVA unless the zone is IOVA-contiguous: one page, or IOVA-as-VA). */
const void *dpdk_sys_memzone_reserve(const char *name, size_t len, unsigned int align,
	void **addr, uint64_t *iova);
/* rte_memzone_free of a memzone from dpdk_sys_memzone_reserve. 0 or a negative errno. */
int dpdk_sys_memzone_free(const void *mz);

/* What a transmit queue's PMD was handed (for tests): rte_eth_tx_burst calls and the most
 * packets any one of them carried. */
struct dpdk_sys_tx_calls {
	uint64_t calls;
	uint16_t max_pkts;
};
/* Counts every rte_eth_tx_burst on (port, queue) into `c` (an ethdev tx callback; `c`
 * must outlive it). Returns the callback handle, NULL with rte_errno set on failure. */
const void *dpdk_sys_tx_calls_watch(uint16_t port_id, uint16_t queue_id,
	struct dpdk_sys_tx_calls *c);
/* Removes a callback from dpdk_sys_tx_calls_watch. 0 or a negative errno. */
int dpdk_sys_tx_calls_unwatch(uint16_t port_id, uint16_t queue_id, const void *cb);

/* Routes DPDK's log stream (rte_openlog_stream) through `fn`, which gets
 * each chunk DPDK writes and returns the bytes consumed (glibc fopencookie). */
typedef long (*dpdk_sys_log_write_fn)(const char *buf, size_t size);
int dpdk_sys_log_capture(dpdk_sys_log_write_fn fn);

/* rte_flow item/attr fillers: field names differ between DPDK releases
 * (23.11 wraps items around rte_*_hdr), C sees the right ones. Multi-byte
 * values are in network byte order. */
void dpdk_sys_flow_attr_set(struct rte_flow_attr *attr, uint32_t group,
			    uint32_t priority, int ingress, int egress, int transfer);
void dpdk_sys_flow_item_eth_set(struct rte_flow_item_eth *item,
				const uint8_t dst[6], const uint8_t src[6],
				uint16_t ether_type_be);
void dpdk_sys_flow_item_ipv4_set(struct rte_flow_item_ipv4 *item,
				 uint32_t src_be, uint32_t dst_be, uint8_t proto);
void dpdk_sys_flow_item_tcp_set(struct rte_flow_item_tcp *item,
				uint16_t src_port_be, uint16_t dst_port_be,
				uint8_t tcp_flags);
void dpdk_sys_flow_item_udp_set(struct rte_flow_item_udp *item,
				uint16_t src_port_be, uint16_t dst_port_be);

/* Parks the EAL interrupt thread in a callback of our own, so that no PMD interrupt
 * callback (nor alarm) runs until dpdk_sys_intr_thread_release: EAL runs them one at a
 * time on that thread. Waits for a callback already running to return. Returns 0 when
 * the thread is parked (release it from the same thread), 1 when the caller is the
 * interrupt thread (nothing to hold or release), a negative errno when it is not
 * parked: -ETIMEDOUT after `timeout_us` (thread stuck), or setup failed. One holder at
 * a time: a second caller waits for the first's release. Never release = the thread
 * stays parked for good (before rte_eal_cleanup). */
int dpdk_sys_intr_thread_hold(uint64_t timeout_us);
void dpdk_sys_intr_thread_release(void);

#endif
