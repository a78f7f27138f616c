// SPDX-License-Identifier: Apache-2.0 OR MIT
// Guest smoke test for the C++ runtime (libstdc++, libgcc_s, exceptions, std::thread).
#include <atomic>
#include <iostream>
#include <stdexcept>
#include <thread>
#include <vector>

int main()
{
	std::atomic<int> n{0};
	std::vector<std::thread> ts;
	for (int i = 0; i < 4; i++)
		ts.emplace_back([&n] {
			try {
				throw std::runtime_error("x");
			} catch (const std::exception &) {
				n++;
			}
		});
	for (auto &t : ts)
		t.join();
	std::cout << "cxx-smoke: " << n << " threads caught their exception" << std::endl;
	return n == 4 ? 0 : 1;
}
