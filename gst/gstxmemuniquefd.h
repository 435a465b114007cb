/* gstxmemuniquefd.h - an owned file descriptor, closed when its owner lets it go:
 * the plugin's own counterpart of the core's xmem::UniqueFd, which is internal to lib/. */
#pragma once

#include <utility>

#include <unistd.h>

class GstXmemUniqueFd
{
public:
	GstXmemUniqueFd() = default;
	explicit GstXmemUniqueFd(int fd) : fd_(fd) {}
	GstXmemUniqueFd(GstXmemUniqueFd &&other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
	GstXmemUniqueFd &operator=(GstXmemUniqueFd &&other) noexcept
	{
		if (this != &other)
			reset(std::exchange(other.fd_, -1));
		return *this;
	}
	~GstXmemUniqueFd() { reset(); }

	/* -1 when none is held. */
	int get() const { return fd_; }
	bool valid() const { return fd_ >= 0; }
	/* Closes the fd held, if any, and holds FD instead. */
	void reset(int fd = -1)
	{
		if (fd_ >= 0)
			::close(fd_);
		fd_ = fd;
	}

private:
	int fd_ = -1;
};
