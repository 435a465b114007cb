/* gstxmemnothrow.h - the boundary between GStreamer's C code and the C++ plugin:
 * no C++ exception may unwind through GStreamer, so every callback catches. */
#pragma once

#include <gst/gst.h>

#include <exception>
#include <type_traits>

/* What a failed callback returns: FALSE, GST_FLOW_ERROR, GST_STATE_CHANGE_FAILURE
 * or nullptr. */
template<typename R>
constexpr R gst_xmem_failure() noexcept
{
	if constexpr (std::is_same_v<R, GstFlowReturn>)
		return GST_FLOW_ERROR;
	else if constexpr (std::is_same_v<R, GstStateChangeReturn>)
		return GST_STATE_CHANGE_FAILURE;
	else if constexpr (std::is_pointer_v<R>)
		return nullptr;
	else
		return R{};
}

/* Reports the exception being handled (call it in a catch block) that reached the
 * callback FUNCTION of OBJECT (a GObject, or nullptr): an error message when OBJECT
 * is an element, so the application stops the pipeline, a warning otherwise. */
inline void gst_xmem_report_exception(gpointer object, const char *function) noexcept
{
	const char *what = "unknown exception";
	try {
		throw;
	} catch (const std::exception &e) {
		what = e.what();
	} catch (...) {
	}
	if (object && GST_IS_ELEMENT(object))
		gst_element_message_full(GST_ELEMENT(object), GST_MESSAGE_ERROR, GST_CORE_ERROR, GST_CORE_ERROR_FAILED,
					 g_strdup("Internal error in the xmem plugin."),
					 g_strdup_printf("C++ exception: %s", what), __FILE__, function, __LINE__);
	else
		g_warning("xmem: C++ exception in %s: %s", function, what);
}

/* GstXmemNoThrow<fn>::call runs FN, and turns an exception into a report on FN's
 * first argument (an element, a pool; a memory is no GObject) and gst_xmem_failure(). */
template<auto Fn>
struct GstXmemNoThrow;

template<typename R, typename First, typename... Rest, R (*Fn)(First, Rest...)>
struct GstXmemNoThrow<Fn> {
	static R call(First first, Rest... rest) noexcept
	{
		try {
			return Fn(first, rest...);
		} catch (...) {
			if constexpr (std::is_same_v<First, GstMemory *>)
				gst_xmem_report_exception(nullptr, GST_FUNCTION);
			else
				gst_xmem_report_exception(first, GST_FUNCTION);
		}
		if constexpr (!std::is_void_v<R>)
			return gst_xmem_failure<R>();
	}
};

/* FN wrapped for a vfunc slot: `basesink->render = GST_XMEM_NO_THROW(render);`. */
#define GST_XMEM_NO_THROW(fn) GST_DEBUG_FUNCPTR(&GstXmemNoThrow<fn>::call)
