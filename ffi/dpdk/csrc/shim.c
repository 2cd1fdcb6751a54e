/* Non-inline wrappers over DPDK's static-inline fast path and over structs
 * whose layout changes between releases. Each function is a direct call to
 * the DPDK function or field of the same name; see wrapper.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fopencookie */
#endif
/* rte_pktmbuf_pool_create_extbuf and rte_dev_dma_map are experimental. */
#define ALLOW_EXPERIMENTAL_API
#include "wrapper.h"

#include <rte_interrupts.h>

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

int dpdk_sys_errno(void) { return rte_errno; }
void dpdk_sys_set_errno(int value) { rte_errno = value; }
unsigned dpdk_sys_lcore_id(void) { return rte_lcore_id(); }

static void flush_lcore_cache(struct rte_mempool *mp, void *arg)
{
	struct rte_mempool_cache *cache =
		rte_mempool_default_cache(mp, *(const unsigned *)arg);
	if (cache != NULL)
		rte_mempool_cache_flush(cache, mp);
}

void dpdk_sys_flush_lcore_caches(void)
{
	unsigned lcore = rte_lcore_id();
	if (lcore != LCORE_ID_ANY)
		rte_mempool_walk(flush_lcore_cache, &lcore);
}
uint64_t dpdk_sys_rdtsc(void) { return rte_rdtsc(); }
const char *dpdk_sys_version(void) { return rte_version(); }

uint16_t dpdk_sys_eth_rx_burst(uint16_t port_id, uint16_t queue_id,
			       struct rte_mbuf **rx_pkts, uint16_t nb_pkts)
{
	return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t dpdk_sys_eth_tx_burst(uint16_t port_id, uint16_t queue_id,
			       struct rte_mbuf **tx_pkts, uint16_t nb_pkts)
{
	return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
}

int dpdk_sys_eth_link_get_nowait(uint16_t port_id, struct dpdk_sys_link *out)
{
	struct rte_eth_link link;
	int ret;

	memset(&link, 0, sizeof(link));
	ret = rte_eth_link_get_nowait(port_id, &link);
	if (ret != 0)
		return ret;
	out->speed_mbps = link.link_speed;
	out->up = link.link_status == RTE_ETH_LINK_UP;
	out->full_duplex = link.link_duplex == RTE_ETH_LINK_FULL_DUPLEX;
	out->autoneg = link.link_autoneg == RTE_ETH_LINK_AUTONEG;
	return 0;
}

struct rte_mbuf *dpdk_sys_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int dpdk_sys_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs,
				unsigned count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void dpdk_sys_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }

void dpdk_sys_pktmbuf_free_bulk(struct rte_mbuf **mbufs, unsigned count)
{
	rte_pktmbuf_free_bulk(mbufs, count);
}

/* A fresh mbuf of `mp` holding `len` bytes (not initialised; their address in *data),
 * with the transmit offload `ol_flags` and header lengths when `ol_flags` is not 0: what
 * rte_pktmbuf_alloc, rte_pktmbuf_append and the offload fields' writes do, in one call
 * (a transmit copy's whole mbuf work). NULL when the pool is empty or `len` is more than
 * one mbuf's tailroom (the mbuf goes back to the pool). */
struct rte_mbuf *dpdk_sys_pktmbuf_alloc_frame(struct rte_mempool *mp, uint16_t len,
					      uint64_t ol_flags, uint64_t l2_len,
					      uint64_t l3_len, uint64_t l4_len, char **data)
{
	struct rte_mbuf *m = rte_pktmbuf_alloc(mp);
	if (m == NULL)
		return NULL;
	if (unlikely(rte_pktmbuf_tailroom(m) < len)) {
		rte_pktmbuf_free(m);
		return NULL;
	}
	m->data_len = len;
	m->pkt_len = len;
	if (ol_flags != 0) {
		m->ol_flags = ol_flags;
		m->l2_len = l2_len;
		m->l3_len = l3_len;
		m->l4_len = l4_len;
		m->tso_segsz = 0;
	}
	*data = rte_pktmbuf_mtod(m, char *);
	return m;
}

char *dpdk_sys_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_prepend(m, len);
}

char *dpdk_sys_pktmbuf_append(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_append(m, len);
}

char *dpdk_sys_pktmbuf_adj(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_adj(m, len);
}

int dpdk_sys_pktmbuf_trim(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_trim(m, len);
}

int dpdk_sys_pktmbuf_chain(struct rte_mbuf *head, struct rte_mbuf *tail)
{
	return rte_pktmbuf_chain(head, tail);
}

void *dpdk_sys_pktmbuf_mtod(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, void *); }
uint16_t dpdk_sys_pktmbuf_data_len(const struct rte_mbuf *m) { return rte_pktmbuf_data_len(m); }
uint32_t dpdk_sys_pktmbuf_pkt_len(const struct rte_mbuf *m) { return rte_pktmbuf_pkt_len(m); }
uint16_t dpdk_sys_pktmbuf_nb_segs(const struct rte_mbuf *m) { return m->nb_segs; }
struct rte_mbuf *dpdk_sys_pktmbuf_next(const struct rte_mbuf *m) { return m->next; }
uint16_t dpdk_sys_pktmbuf_headroom(const struct rte_mbuf *m) { return rte_pktmbuf_headroom(m); }
uint16_t dpdk_sys_pktmbuf_tailroom(const struct rte_mbuf *m) { return rte_pktmbuf_tailroom(m); }

uint16_t dpdk_sys_pktmbuf_data_room_size(struct rte_mempool *mp)
{
	return rte_pktmbuf_data_room_size(mp);
}

uint16_t dpdk_sys_pktmbuf_priv_size(struct rte_mempool *mp)
{
	return rte_pktmbuf_priv_size(mp);
}

struct rte_mempool *dpdk_sys_mbuf_pool(const struct rte_mbuf *m) { return m->pool; }
uint16_t dpdk_sys_mbuf_refcnt_read(const struct rte_mbuf *m) { return rte_mbuf_refcnt_read(m); }

void dpdk_sys_pktmbuf_refcnt_update(struct rte_mbuf *m, int16_t v)
{
	rte_pktmbuf_refcnt_update(m, v);
}

uint64_t dpdk_sys_mbuf_ol_flags(const struct rte_mbuf *m) { return m->ol_flags; }

/* Inlined into dpdk_sys_mbuf_view (an exported function may be interposed, so the
 * compiler would call it there). */
static inline int mbuf_owns_buf(const struct rte_mbuf *m)
{
	/* Attached to another mbuf's buffer: that buffer is shared. */
	if (RTE_MBUF_CLONED(m))
		return 0;
	if (RTE_MBUF_HAS_EXTBUF(m)) {
		/* A pinned external buffer (pools from rte_pktmbuf_pool_create_extbuf) is
		 * the mbuf's own unless indirect mbufs attached to it; any other external
		 * buffer belongs to whoever attached it. */
		if (!RTE_MBUF_HAS_PINNED_EXTBUF(m) || m->shinfo == NULL)
			return 0;
		return rte_mbuf_ext_refcnt_read(m->shinfo) == 1;
	}
	return 1;
}
int dpdk_sys_mbuf_owns_buf(const struct rte_mbuf *m) { return mbuf_owns_buf(m); }
void dpdk_sys_mbuf_set_ol_flags(struct rte_mbuf *m, uint64_t flags) { m->ol_flags = flags; }

void dpdk_sys_mbuf_set_tx_offload(struct rte_mbuf *m, uint64_t l2_len,
				  uint64_t l3_len, uint64_t l4_len, uint64_t tso_segsz)
{
	m->l2_len = l2_len;
	m->l3_len = l3_len;
	m->l4_len = l4_len;
	m->tso_segsz = tso_segsz;
}

uint32_t dpdk_sys_mbuf_rss_hash(const struct rte_mbuf *m) { return m->hash.rss; }
uint32_t dpdk_sys_mbuf_packet_type(const struct rte_mbuf *m) { return m->packet_type; }

struct rte_mbuf_ext_shared_info *dpdk_sys_pktmbuf_ext_shinfo_init_helper(
	void *buf_addr, uint16_t *buf_len, rte_mbuf_extbuf_free_callback_t free_cb,
	void *fcb_opaque)
{
	return rte_pktmbuf_ext_shinfo_init_helper(buf_addr, buf_len, free_cb, fcb_opaque);
}

void dpdk_sys_pktmbuf_attach_extbuf(struct rte_mbuf *m, void *buf_addr,
				    rte_iova_t buf_iova, uint16_t buf_len,
				    struct rte_mbuf_ext_shared_info *shinfo)
{
	rte_pktmbuf_attach_extbuf(m, buf_addr, buf_iova, buf_len, shinfo);
}

void dpdk_sys_mbuf_view(const struct rte_mbuf *m, struct dpdk_sys_mbuf_view *out)
{
	out->buf_addr = m->buf_addr;
#if RTE_VERSION >= RTE_VERSION_NUM(22, 11, 0, 0)
	out->buf_iova = rte_mbuf_iova_get(m);
#else
	out->buf_iova = m->buf_iova;
#endif
	out->pool = m->pool;
	out->pkt_len = m->pkt_len;
	out->buf_len = m->buf_len;
	out->data_off = m->data_off;
	out->data_len = m->data_len;
	out->priv_size = m->priv_size;
	out->nb_segs = m->nb_segs;
	out->refcnt = rte_mbuf_refcnt_read(m);
	out->owns_buf = (uint16_t)mbuf_owns_buf(m);
}

struct rte_mempool *dpdk_sys_pktmbuf_pool_create_extbuf(
	const char *name, unsigned int n, unsigned int cache_size,
	uint16_t priv_size, uint16_t data_room_size, int socket_id,
	const struct rte_pktmbuf_extmem *ext_mem, unsigned int ext_num)
{
	return rte_pktmbuf_pool_create_extbuf(name, n, cache_size, priv_size,
					      data_room_size, socket_id, ext_mem,
					      ext_num);
}

void dpdk_sys_ext_shinfo_init(struct rte_mbuf_ext_shared_info *shinfo,
			      rte_mbuf_extbuf_free_callback_t free_cb,
			      void *fcb_opaque)
{
	shinfo->free_cb = free_cb;
	shinfo->fcb_opaque = fcb_opaque;
	rte_mbuf_ext_refcnt_set(shinfo, 1);
}

uint16_t dpdk_sys_ext_shinfo_refcnt(const struct rte_mbuf_ext_shared_info *shinfo)
{
	return rte_mbuf_ext_refcnt_read(shinfo);
}

struct rte_mbuf *dpdk_sys_pktmbuf_unchain(struct rte_mbuf *m)
{
	struct rte_mbuf *rest = m->next;

	if (rest == NULL)
		return NULL;
	rest->nb_segs = m->nb_segs - 1;
	rest->pkt_len = m->pkt_len - m->data_len;
	m->next = NULL;
	m->nb_segs = 1;
	m->pkt_len = m->data_len;
	return rest;
}

static struct rte_device *port_device(uint16_t port_id)
{
	struct rte_eth_dev_info info;

	if (rte_eth_dev_info_get(port_id, &info) != 0)
		return NULL;
	return info.device;
}

int dpdk_sys_port_dma_map(uint16_t port_id, void *addr, uint64_t iova, size_t len)
{
	struct rte_device *dev = port_device(port_id);

	if (dev == NULL)
		return -ENODEV;
	if (rte_dev_dma_map(dev, addr, iova, len) != 0)
		return -(rte_errno != 0 ? rte_errno : EIO);
	return 0;
}

const void *dpdk_sys_memzone_reserve(const char *name, size_t len, unsigned int align,
	void **addr, uint64_t *iova)
{
	/* Not RTE_MEMZONE_IOVA_CONTIG: in IOVA-as-PA mode that needs two physically
	 * adjacent hugepages (the heap's element header precedes the aligned data). */
	const struct rte_memzone *mz = rte_memzone_reserve_aligned(name, len, SOCKET_ID_ANY,
		0, align);

	if (mz == NULL)
		return NULL;
	*addr = mz->addr;
	/* One IOVA for the whole zone only if it is contiguous: within one page, or
	 * IOVA-as-VA. */
	*iova = (((uintptr_t)mz->addr % mz->hugepage_sz) + len <= mz->hugepage_sz ||
		 rte_eal_iova_mode() == RTE_IOVA_VA) ? mz->iova : RTE_BAD_IOVA;
	return mz;
}

int dpdk_sys_memzone_free(const void *mz)
{
	return rte_memzone_free((const struct rte_memzone *)mz);
}

static uint16_t tx_calls_count(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts,
	uint16_t nb_pkts, void *arg)
{
	struct dpdk_sys_tx_calls *c = arg;

	c->calls++;
	if (nb_pkts > c->max_pkts)
		c->max_pkts = nb_pkts;
	return nb_pkts;
}

const void *dpdk_sys_tx_calls_watch(uint16_t port_id, uint16_t queue_id,
	struct dpdk_sys_tx_calls *c)
{
	return rte_eth_add_tx_callback(port_id, queue_id, tx_calls_count, c);
}

int dpdk_sys_tx_calls_unwatch(uint16_t port_id, uint16_t queue_id, const void *cb)
{
	return rte_eth_remove_tx_callback(port_id, queue_id,
		(const struct rte_eth_rxtx_callback *)cb);
}

int dpdk_sys_port_dma_unmap(uint16_t port_id, void *addr, uint64_t iova, size_t len)
{
	struct rte_device *dev = port_device(port_id);

	if (dev == NULL)
		return -ENODEV;
	if (rte_dev_dma_unmap(dev, addr, iova, len) != 0)
		return -(rte_errno != 0 ? rte_errno : EIO);
	return 0;
}

void dpdk_sys_flow_attr_set(struct rte_flow_attr *attr, uint32_t group,
			    uint32_t priority, int ingress, int egress, int transfer)
{
	memset(attr, 0, sizeof(*attr));
	attr->group = group;
	attr->priority = priority;
	attr->ingress = ingress != 0;
	attr->egress = egress != 0;
	attr->transfer = transfer != 0;
}

void dpdk_sys_flow_item_eth_set(struct rte_flow_item_eth *item,
				const uint8_t dst[6], const uint8_t src[6],
				uint16_t ether_type_be)
{
	memset(item, 0, sizeof(*item));
	memcpy(item->dst.addr_bytes, dst, RTE_ETHER_ADDR_LEN);
	memcpy(item->src.addr_bytes, src, RTE_ETHER_ADDR_LEN);
	item->type = ether_type_be;
}

void dpdk_sys_flow_item_ipv4_set(struct rte_flow_item_ipv4 *item,
				 uint32_t src_be, uint32_t dst_be, uint8_t proto)
{
	memset(item, 0, sizeof(*item));
	item->hdr.src_addr = src_be;
	item->hdr.dst_addr = dst_be;
	item->hdr.next_proto_id = proto;
}

void dpdk_sys_flow_item_tcp_set(struct rte_flow_item_tcp *item,
				uint16_t src_port_be, uint16_t dst_port_be,
				uint8_t tcp_flags)
{
	memset(item, 0, sizeof(*item));
	item->hdr.src_port = src_port_be;
	item->hdr.dst_port = dst_port_be;
	item->hdr.tcp_flags = tcp_flags;
}

void dpdk_sys_flow_item_udp_set(struct rte_flow_item_udp *item,
				uint16_t src_port_be, uint16_t dst_port_be)
{
	memset(item, 0, sizeof(*item));
	item->hdr.src_port = src_port_be;
	item->hdr.dst_port = dst_port_be;
}

static dpdk_sys_log_write_fn log_write_fn;

static ssize_t log_cookie_write(void *cookie, const char *buf, size_t size)
{
	(void)cookie;
	return log_write_fn != NULL ? log_write_fn(buf, size) : (ssize_t)size;
}

int dpdk_sys_log_capture(dpdk_sys_log_write_fn fn)
{
	cookie_io_functions_t io = { .write = log_cookie_write };
	FILE *f;

	log_write_fn = fn;
	f = fopencookie(NULL, "w", io);
	if (f == NULL)
		return -1;
	setvbuf(f, NULL, _IOLBF, 0);
	return rte_openlog_stream(f);
}

/* ---- holding the EAL interrupt thread ---- */

/* One interrupt source of our own (an eventfd, private memory) whose callback parks
 * the interrupt thread until released. EAL runs interrupt and alarm callbacks one at a
 * time on that thread, so while it is parked in ours no PMD callback runs: e.g. DPDK
 * 22.11 memif's control-channel callback, which tears the link down when the peer
 * disconnects, with no lock against our dev_stop/dev_close of the same port. */
enum { HOLD_IDLE, HOLD_REQUESTED, HOLD_PARKED };

static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER; /* one holder at a time */
static pthread_mutex_t park_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t park_cv;
static int park_cv_ready;
static int park_state = HOLD_IDLE;
static int park_efd = -1;
static struct rte_intr_handle *park_ih;

static void park_cb(void *arg)
{
	uint64_t n;

	(void)arg;
	/* Level-triggered: drain, or the thread is called again at once. */
	if (read(park_efd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		return;
	pthread_mutex_lock(&park_mu);
	if (park_state == HOLD_REQUESTED) {
		park_state = HOLD_PARKED;
		pthread_cond_broadcast(&park_cv);
		while (park_state == HOLD_PARKED)
			pthread_cond_wait(&park_cv, &park_mu);
	}
	pthread_mutex_unlock(&park_mu);
}

/* Called with hold_lock held. */
static int park_setup(void)
{
	pthread_condattr_t attr;
	int ret;

	if (park_ih != NULL)
		return 0;
	if (!park_cv_ready) {
		pthread_condattr_init(&attr);
		pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* timed waits */
		pthread_cond_init(&park_cv, &attr);
		pthread_condattr_destroy(&attr);
		park_cv_ready = 1;
	}
	park_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (park_efd < 0)
		return -errno;
	park_ih = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
	if (park_ih == NULL || rte_intr_fd_set(park_ih, park_efd) != 0 ||
	    rte_intr_type_set(park_ih, RTE_INTR_HANDLE_EXT) != 0) {
		ret = -ENOMEM;
		goto fail;
	}
	ret = rte_intr_callback_register(park_ih, park_cb, NULL);
	if (ret < 0)
		goto fail;
	return 0;
fail:
	rte_intr_instance_free(park_ih);
	park_ih = NULL;
	close(park_efd);
	park_efd = -1;
	return ret;
}

int dpdk_sys_intr_thread_hold(uint64_t timeout_us)
{
	uint64_t one = 1;
	struct timespec end;
	int ret = 0;

	if (rte_thread_is_intr())
		return 1; /* already serialised with every interrupt callback */
	pthread_mutex_lock(&hold_lock);
	ret = park_setup();
	if (ret < 0) {
		pthread_mutex_unlock(&hold_lock);
		return ret;
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += timeout_us / 1000000;
	end.tv_nsec += (long)(timeout_us % 1000000) * 1000;
	if (end.tv_nsec >= 1000000000) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&park_mu);
	park_state = HOLD_REQUESTED;
	if (write(park_efd, &one, sizeof(one)) != sizeof(one))
		ret = -errno;
	while (ret == 0 && park_state != HOLD_PARKED) {
		int w = pthread_cond_timedwait(&park_cv, &park_mu, &end);

		if (w == ETIMEDOUT && park_state != HOLD_PARKED)
			ret = -ETIMEDOUT;
	}
	if (ret < 0)
		park_state = HOLD_IDLE; /* a late callback then returns at once */
	pthread_mutex_unlock(&park_mu);
	if (ret < 0)
		pthread_mutex_unlock(&hold_lock);
	return ret;
}

void dpdk_sys_intr_thread_release(void)
{
	if (rte_thread_is_intr())
		return;
	pthread_mutex_lock(&park_mu);
	park_state = HOLD_IDLE;
	pthread_cond_broadcast(&park_cv);
	pthread_mutex_unlock(&park_mu);
	pthread_mutex_unlock(&hold_lock);
}
