#include "chorus/props/battery.hpp"

#include "battery/families.hpp"

namespace chorus::props {

std::vector<Property> battery() {
  std::vector<Property> all;
  for (std::vector<Property> family :
       {families::reduction_properties(), families::law_properties(), families::shape_properties(),
        families::async_properties(), families::error_properties(),
        families::schedule_properties()}) {
    for (Property& property : family) {
      all.push_back(std::move(property));
    }
  }
  return all;
}

}  // namespace chorus::props
